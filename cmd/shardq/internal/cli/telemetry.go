// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/shardq/shardq"
)

// telemetry is the command's OpenTelemetry SDK: Prometheus text at
// --metrics-addr/metrics, and OTLP over HTTP to --otlp-endpoint or where
// the standard OTEL_EXPORTER_OTLP_* variables say. The library itself
// only speaks the API; the binary chooses the SDK.
type telemetry struct {
	tp     *sdktrace.TracerProvider // nil without OTLP
	mp     *sdkmetric.MeterProvider
	server *http.Server // nil without --metrics-addr
	served chan error
}

// otlpEnv are the variables that turn OTLP export on without the flag.
var otlpEnv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"}

// checkTelemetryFlags validates --metrics-addr and --otlp-endpoint before
// anything starts.
func (a *app) checkTelemetryFlags() error {
	if a.metricsSeries <= 0 {
		return usagef("--metrics-series must be more than 0")
	}
	if a.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(a.metricsAddr); err != nil {
			return usagef("--metrics-addr: %q must be HOST:PORT (like 127.0.0.1:9464): %v", a.metricsAddr, err)
		}
	}
	if a.otlpEndpoint != "" {
		u, err := url.Parse(a.otlpEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("--otlp-endpoint: %q must be an http:// or https:// URL of an OTLP/HTTP receiver (like http://localhost:4318)", a.otlpEndpoint)
		}
	}
	return nil
}

// otlpOn reports whether OTLP export is asked for, by flag or environment.
func (a *app) otlpOn() bool {
	if a.otlpEndpoint != "" {
		return true
	}
	for _, k := range otlpEnv {
		if a.env.Getenv(k) != "" {
			return true
		}
	}
	return false
}

// startTelemetry starts what the flags ask for and fills cfg's providers;
// nil when they ask for nothing (the client then uses the no-op globals).
func (a *app) startTelemetry(ctx context.Context, cfg *shardq.Config) (*telemetry, error) {
	if a.metricsAddr == "" && !a.otlpOn() && !a.serveMetrics {
		return nil, nil
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("shardq")), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &telemetry{}
	// Series per instrument are capped: tenants and topics come from
	// clients, and past the cap their points go to one series marked
	// otel.metric.overflow="true" instead of growing without bound.
	readers := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithCardinalityLimit(a.metricsSeries),
		// serve's HTTP metrics (otelhttp) take server.address and
		// server.port from the request's Host header: a client's bytes,
		// which must not make series.
		sdkmetric.WithView(sdkmetric.NewView(sdkmetric.Instrument{Name: "http.server.*"},
			sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter("server.address", "server.port")}))}
	if a.metricsAddr != "" || a.serveMetrics {
		reg := prometheus.NewRegistry()
		// The Go runtime's and the process's own series beside shardq's.
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		a.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: promLog{a}})
	}
	if a.metricsAddr != "" {
		ln, err := net.Listen("tcp", a.metricsAddr)
		if err != nil {
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", a.metrics)
		t.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
		t.served = make(chan error, 1)
		go func() { t.served <- t.server.Serve(ln) }()
	}
	if a.otlpOn() {
		var topts []otlptracehttp.Option
		var mopts []otlpmetrichttp.Option
		if a.otlpEndpoint != "" {
			base := strings.TrimSuffix(a.otlpEndpoint, "/")
			topts = append(topts, otlptracehttp.WithEndpointURL(base+"/v1/traces"))
			mopts = append(mopts, otlpmetrichttp.WithEndpointURL(base+"/v1/metrics"))
		}
		texp, err := otlptracehttp.New(ctx, topts...)
		if err != nil {
			t.shutdown()
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		mexp, err := otlpmetrichttp.New(ctx, mopts...)
		if err != nil {
			t.shutdown()
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		// serve's spans carry a client's path and user agent: each
		// attribute value is cut at 1 KiB.
		limits := sdktrace.NewSpanLimits()
		limits.AttributeValueLengthLimit = 1024
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(texp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
		cfg.TracerProvider, a.tracerProvider = t.tp, t.tp
	}
	t.mp = sdkmetric.NewMeterProvider(readers...)
	cfg.MeterProvider, a.meterProvider = t.mp, t.mp
	// The trace context travels in messages: W3C traceparent, and baggage.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// shutdown flushes what is buffered (spans, a last metric export) and
// stops the /metrics server, bounded by a few seconds.
func (t *telemetry) shutdown() error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	if t.server != nil {
		errs = append(errs, t.server.Shutdown(ctx))
		if err := <-t.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("metrics server: %w", err))
		}
	}
	return errors.Join(errs...)
}

// promLog sends promhttp's errors (a failed scrape) to the command's log.
type promLog struct{ a *app }

func (l promLog) Println(v ...any) {
	l.a.logger().Warn("shardq: serving /metrics: " + strings.TrimSpace(fmt.Sprintln(v...)))
}
