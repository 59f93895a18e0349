// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/shardq/shardq/cmd/shardq/internal/chaoscheck"
)

// Timeline is a run's throughput and latency second by second, with its
// faults.
type Timeline struct {
	Start     int64     // Unix ns of second 0
	Published []int     // messages acknowledged to publishers, per second
	Handled   []int     // successful handler calls of GroupSub, per second
	P50, P99  []float64 // GroupSub's latency (ms) from acknowledgement to first delivery, by publish second (NaN: none)
	Faults    []chaoscheck.Event
	// The whole run's latency (ms) and the publishers' mean rate.
	AllP50, AllP99, AllMax, Rate float64
	// ByTenant is the whole run's latency (ms) of each tenant: on Vitess,
	// a fault on one shard's primary shows in its tenants' alone.
	ByTenant map[string]Latency
}

// Latency is a run's quantiles of acknowledgement to first delivery (ms).
type Latency struct{ P50, P99, Max float64 }

// BuildTimeline reads a run's events.
func BuildTimeline(evs []chaoscheck.Event) Timeline {
	var tl Timeline
	first := map[string]int64{} // id: first GroupSub delivery
	var start, end int64 = math.MaxInt64, 0
	for _, e := range evs {
		switch e.Op {
		case chaoscheck.OpPublish:
			start, end = min(start, e.End), max(end, e.End)
		case chaoscheck.OpHandle:
			if e.Group == GroupSub {
				if t, ok := first[e.ID]; !ok || e.Start < t {
					first[e.ID] = e.Start
				}
				end = max(end, e.End)
			}
		case chaoscheck.OpFault:
			tl.Faults = append(tl.Faults, e)
		}
	}
	if start == math.MaxInt64 {
		return tl
	}
	tl.Start = start
	n := int((end-start)/1e9) + 1
	tl.Published, tl.Handled = make([]int, n), make([]int, n)
	lat := make([][]float64, n)
	byTenant := map[string][]float64{}
	sec := func(t int64) int { return min(max(int((t-start)/1e9), 0), n-1) }
	for _, e := range evs {
		switch {
		case e.Op == chaoscheck.OpPublish:
			s := sec(e.End)
			tl.Published[s]++
			if e.Topic == TopicOrdered {
				if t, ok := first[e.ID]; ok {
					ms := float64(t-e.End) / 1e6
					lat[s] = append(lat[s], ms)
					byTenant[e.Tenant] = append(byTenant[e.Tenant], ms)
				}
			}
		case e.Op == chaoscheck.OpHandle && e.Group == GroupSub && e.Result == chaoscheck.ResultOK:
			tl.Handled[sec(e.End)]++
		}
	}
	tl.P50, tl.P99 = make([]float64, n), make([]float64, n)
	var all []float64
	total := 0
	for i, l := range lat {
		tl.P50[i], tl.P99[i] = quantile(l, 0.50), quantile(l, 0.99)
		all = append(all, l...)
		total += tl.Published[i]
	}
	tl.AllP50, tl.AllP99, tl.AllMax = quantile(all, 0.50), quantile(all, 0.99), quantile(all, 1)
	tl.ByTenant = map[string]Latency{}
	for tenant, l := range byTenant {
		tl.ByTenant[tenant] = Latency{quantile(l, 0.50), quantile(l, 0.99), quantile(l, 1)}
	}
	tl.Rate = float64(total) / float64(n)
	return tl
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	return xs[min(int(q*float64(len(xs))), len(xs)-1)]
}

// WriteSVG draws the timeline: throughput above, latency (log scale)
// below, a line at each fault.
func (tl Timeline) WriteSVG(w io.Writer, title string) error {
	const W, H, left, right, top, mid, bottom = 1200, 560, 70, 20, 40, 280, 520
	n := max(len(tl.Published), 1)
	x := func(s float64) float64 { return left + s/float64(n)*(W-left-right) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", left, escape(title))
	// Throughput panel.
	peak := 1
	for i := range tl.Published {
		peak = max(peak, tl.Published[i], tl.Handled[i])
	}
	ty := func(v int) float64 { return mid - 20 - float64(v)/float64(peak)*(mid-20-top) }
	fmt.Fprintf(&b, `<text x="5" y="%d">msg/s</text><text x="5" y="%.0f">%d</text><text x="5" y="%d">0</text>`+"\n", top, ty(peak)+4, peak, mid-20)
	series := func(vals []float64, y func(float64) float64, color string) {
		var pts []string
		for i, v := range vals {
			if math.IsNaN(v) {
				if len(pts) > 1 {
					fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" points="%s"/>`+"\n", color, strings.Join(pts, " "))
				}
				pts = nil
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)+0.5), y(v)))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		}
	}
	ints := func(v []int) []float64 {
		f := make([]float64, len(v))
		for i := range v {
			f[i] = float64(v[i])
		}
		return f
	}
	series(ints(tl.Published), func(v float64) float64 { return ty(int(v)) }, "#1f77b4")
	series(ints(tl.Handled), func(v float64) float64 { return ty(int(v)) }, "#2ca02c")
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#1f77b4">published</text><text x="%d" y="%d" fill="#2ca02c">handled (group sub)</text>`+"\n", W-260, top, W-170, top)
	// Latency panel, log scale from 1 ms to 100 s.
	ly := func(ms float64) float64 {
		v := math.Log10(min(max(ms, 1), 1e5)) / 5
		return bottom - v*(bottom-mid-10)
	}
	for _, ms := range []float64{1, 10, 100, 1000, 10000, 100000} {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%s</text>`+"\n", left, W-right, ly(ms), ly(ms), ly(ms)+4, msLabel(ms))
	}
	series(tl.P50, ly, "#9467bd")
	series(tl.P99, ly, "#d62728")
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#9467bd">p50 latency</text><text x="%d" y="%d" fill="#d62728">p99 latency (publish acknowledged to first delivery, group sub)</text>`+"\n", left, mid+5, left+80, mid+5)
	// Faults.
	colors := map[string]string{chaoscheck.FaultKill: "#d62728", chaoscheck.FaultStop: "#ff7f0e", chaoscheck.FaultCut: "#8c564b",
		chaoscheck.FaultBlackhole: "#000000", chaoscheck.FaultDelay: "#bcbd22", chaoscheck.FaultDBRestart: "#e377c2", chaoscheck.FaultDiskFull: "#17becf", chaoscheck.FaultReparent: "#7f7f7f"}
	for _, f := range tl.Faults {
		c, ok := colors[f.Fault]
		if !ok {
			continue
		}
		fx := x(float64(f.Start-tl.Start) / 1e9)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-opacity="0.5"><title>%s %s</title></line>`+"\n", fx, fx, top, bottom, c, f.Fault, escape(f.Proc))
	}
	lx := left
	for _, k := range []string{chaoscheck.FaultKill, chaoscheck.FaultStop, chaoscheck.FaultCut, chaoscheck.FaultBlackhole, chaoscheck.FaultDelay, chaoscheck.FaultDBRestart, chaoscheck.FaultDiskFull, chaoscheck.FaultReparent} {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">| %s</text>`+"\n", lx, H-15, colors[k], k)
		lx += 90
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">seconds 0 to %d</text>`+"\n", W-150, H-15, n)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func msLabel(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%gs", ms/1000)
	}
	return fmt.Sprintf("%gms", ms)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
