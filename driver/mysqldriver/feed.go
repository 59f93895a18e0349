// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
)

var _ driver.HeadFeed = (*Driver)(nil)

// headTable is the table whose row events the feed reads: a publish
// writes its partition's head row in the same transaction as its messages.
const headTable = "queue_partitions"

// Server error numbers the feed acts on.
const (
	errAccessDenied      = 1045 // ER_ACCESS_DENIED_ERROR
	errSpecificAccess    = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR: a missing privilege
	errReadingBinlog     = 1236 // ER_MASTER_FATAL_ERROR_READING_BINLOG: e.g. the position was purged
	errNoBinaryLogging   = 1381 // ER_NO_BINARY_LOGGING
	errDBAccessDenied    = 1044
	errTableAccessDenied = 1142
)

// feedRetryMax bounds the pause between reconnects.
const feedRetryMax = 5 * time.Second

// FeedHeads is the MySQL/MariaDB change feed: it reads the server's binary
// log as a replica does (github.com/go-mysql-org/go-mysql), decodes only
// the row events of this database's head table, and reports each
// transaction's partitions at its commit event (docs/feed.md). It needs
// the binary log on in ROW format and, for the connecting user,
// REPLICATION SLAVE and REPLICATION CLIENT (MariaDB: BINLOG MONITOR); a
// server without them makes it return ErrFeedUnavailable naming what is
// missing. After a cut it reconnects from the last commit it read; from a
// position the server no longer has (purged logs) it starts at the
// server's current position and rescans. Given the option HeadFeed (on
// Vitess, vitessfeed), it runs that feed instead.
func (d *Driver) FeedHeads(ctx context.Context, sink driver.FeedSink) error {
	if d.feed != nil {
		return d.feed.FeedHeads(ctx, sink)
	}
	return d.feedFrom(ctx, sink, nil)
}

// binlogFeed is one FeedHeads run's state.
type binlogFeed struct {
	d        *Driver
	cfg      replication.BinlogSyncerConfig
	schema   string
	cols     headColumns
	pos      gomysql.Position
	streamed bool // the last stream got as far as an event
	// skips counts the events passed over (eventBound) since skipNoted,
	// when the last line said so.
	skips     int
	skipNoted time.Time
}

// headColumns are the head table's column positions in a row image.
type headColumns struct{ tenant, topic, key, head int }

// feedFrom runs the feed from start, or from the server's current
// position when start is nil (tests start from a stale one).
func (d *Driver) feedFrom(ctx context.Context, sink driver.FeedSink, start *gomysql.Position) error {
	pause := 100 * time.Millisecond
	var f *binlogFeed
	for f == nil {
		// A server that cannot feed says so for good; one that does not
		// answer (restarting, a cut) is asked again.
		var err error
		if f, err = d.newBinlogFeed(ctx); err == nil {
			if start != nil {
				f.pos = *start
			} else {
				f.pos, err = d.binlogPosition(ctx)
			}
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, driver.ErrFeedUnavailable):
			return err
		case ctx.Err() != nil:
			return nil
		}
		f = nil
		sink.Note("shardq: change feed cannot start yet; retrying", "err", err, "retry_in", pause)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, feedRetryMax)
	}
	pause = 100 * time.Millisecond
	for {
		err := f.stream(ctx, sink)
		if ctx.Err() != nil {
			return nil
		}
		sink.Down(err)
		var me *gomysql.MyError
		switch {
		case errors.As(err, &me) && me.Code == errReadingBinlog:
			// The position is gone (purged, or a log reset): start at the
			// server's current one; Up's rescan finds what was missed.
			pos, perr := d.binlogPosition(ctx)
			if perr != nil {
				err = perr
				break
			}
			sink.Note("shardq: change feed position no longer on the server; continuing from the current one and rescanning",
				"was", f.pos.String(), "now", pos.String(), "err", me.Message)
			f.pos = pos
			continue
		case errors.As(err, &me) && isPrivilegeError(me.Code):
			return fmt.Errorf("mysql change feed: %w: reading the binary log needs REPLICATION SLAVE: %w", driver.ErrFeedUnavailable, err)
		}
		if f.streamed {
			pause = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, feedRetryMax)
	}
}

func isPrivilegeError(code uint16) bool {
	switch code {
	case errAccessDenied, errSpecificAccess, errDBAccessDenied, errTableAccessDenied:
		return true
	}
	return false
}

// unavailable wraps why the feed cannot run.
func unavailable(why string, err error) error {
	if err != nil {
		return fmt.Errorf("mysql change feed: %w: %s: %w", driver.ErrFeedUnavailable, why, err)
	}
	return fmt.Errorf("mysql change feed: %w: %s", driver.ErrFeedUnavailable, why)
}

// newBinlogFeed checks what the feed needs, naming what is missing, and
// reads the head table's column positions.
func (d *Driver) newBinlogFeed(ctx context.Context) (*binlogFeed, error) {
	c := d.feedCfg
	if c == nil {
		return nil, unavailable("the driver was made with New over a caller's pool; Open it with a DSN to give the feed its connection settings", nil)
	}
	if c.Net != "tcp" {
		return nil, unavailable(fmt.Sprintf("the DSN's network is %q; the feed connects over tcp only", c.Net), nil)
	}
	host, portText, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return nil, unavailable("the DSN's address "+c.Addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, unavailable("the DSN's port "+portText, err)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var version, logBin, format string
	if err := d.db.QueryRowContext(qctx, "SELECT @@version, @@log_bin, @@binlog_format").Scan(&version, &logBin, &format); err != nil {
		return nil, fmt.Errorf("mysql change feed: reading @@version, @@log_bin and @@binlog_format: %w", err)
	}
	switch {
	case strings.Contains(strings.ToLower(version), "vitess"):
		return nil, unavailable("this is Vitess (vtgate), which does not serve binary logs; give Open the option "+
			"HeadFeed(vitessfeed.New(…)) to stream its shards' changes through VStream (docs/vitess.md)", nil)
	case logBin != "1" && !strings.EqualFold(logBin, "ON"):
		return nil, unavailable("the binary log is off (log_bin); start the server with log_bin and binlog_format=ROW", nil)
	case !strings.EqualFold(format, "ROW"):
		return nil, unavailable(fmt.Sprintf("binlog_format is %s; the feed needs ROW", format), nil)
	}
	cols, err := d.headColumns(qctx, d.feedSchema)
	if err != nil {
		return nil, err
	}
	flavor := gomysql.MySQLFlavor
	if strings.Contains(strings.ToLower(version), "mariadb") {
		flavor = gomysql.MariaDBFlavor
	}
	f := &binlogFeed{d: d, schema: d.feedSchema, cols: cols}
	const readTimeout = 5 * time.Second
	f.cfg = replication.BinlogSyncerConfig{
		// A replica's id must be unique among the server's replicas: the
		// server drops an older connection with the same id.
		ServerID: 1<<31 + rand.Uint32N(1<<31-1),
		Flavor:   flavor, Host: host, Port: uint16(port), User: c.User, Password: c.Passwd, TLSConfig: c.TLS,
		// Heartbeats from an idle server keep the read deadline from
		// firing; a connection that stays silent past it is cut.
		HeartbeatPeriod: time.Second, ReadTimeout: readTimeout,
		DisableRetrySync: true, // we reconnect, from the last commit read
		// Events larger than feedMax never reach go-mysql, which reads
		// each event whole (eventBound); at most this many bounded events
		// wait between its reader and stream (10240 by default).
		Option:          func(c *client.Conn) error { boundEvents(c, d.feedMax, readTimeout); return nil },
		EventCacheCount: 64,
		Logger:          slog.New(quieter{d.logs.logger().Handler()}).With("driver", "mysql", "component", "binlog"),
		// Only the head table's rows are decoded: the messages' payloads
		// pass through undecoded.
		RowsEventDecodeFunc: f.decodeRows,
	}
	return f, nil
}

// headColumns reads the head table's column positions (a row image lists
// columns by position, and binlog_row_metadata=FULL is not the default).
func (d *Driver) headColumns(ctx context.Context, schema string) (headColumns, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT column_name, ordinal_position FROM information_schema.columns WHERE table_schema = ? AND table_name = ?", schema, headTable)
	if err != nil {
		return headColumns{}, fmt.Errorf("mysql change feed: reading the head table's columns: %w", err)
	}
	defer rows.Close()
	pos := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			return headColumns{}, fmt.Errorf("mysql change feed: reading the head table's columns: %w", err)
		}
		pos[strings.ToLower(name)] = n - 1
	}
	if err := rows.Err(); err != nil {
		return headColumns{}, fmt.Errorf("mysql change feed: reading the head table's columns: %w", err)
	}
	cols := headColumns{tenant: -1, topic: -1, key: -1, head: -1}
	for name, p := range map[string]*int{"tenant": &cols.tenant, "topic": &cols.topic, "partition_key": &cols.key, "head_offset": &cols.head} {
		v, ok := pos[name]
		if !ok {
			return headColumns{}, unavailable(fmt.Sprintf("%s.%s has no column %s: is the database migrated?", schema, headTable, name), driver.ErrNotMigrated)
		}
		*p = v
	}
	return cols, nil
}

// binlogPosition is the server's current binary log position.
func (d *Driver) binlogPosition(ctx context.Context) (gomysql.Position, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var pos gomysql.Position
	var errs []error
	db := d.db
	if d.feedDB != nil {
		db = d.feedDB // FeedDSN's user: the queue's may lack REPLICATION CLIENT
	}
	// SHOW MASTER STATUS is SHOW BINARY LOG STATUS from MySQL 8.2 on (and
	// gone in 8.4); MariaDB knows the first.
	for _, stmt := range []string{"SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"} {
		rows, err := db.QueryContext(qctx, stmt)
		if err != nil {
			var me *mysql.MySQLError
			if errors.As(err, &me) && (isPrivilegeError(me.Number) || me.Number == errNoBinaryLogging) {
				return pos, unavailable("reading the binary log position needs REPLICATION CLIENT (MariaDB: BINLOG MONITOR)", err)
			}
			errs = append(errs, err)
			continue
		}
		cols, _ := rows.Columns()
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		found := false
		if rows.Next() && len(cols) >= 2 {
			if err = rows.Scan(ptrs...); err == nil {
				var n uint64
				n, err = strconv.ParseUint(string(vals[1]), 10, 32)
				pos, found = gomysql.Position{Name: string(vals[0]), Pos: uint32(n)}, err == nil
			}
		}
		if err = errors.Join(err, rows.Err(), rows.Close()); err == nil && !found {
			return pos, unavailable("the server reports no binary log position (log_bin off?)", nil)
		}
		if found {
			return pos, nil
		}
		errs = append(errs, err)
	}
	return pos, fmt.Errorf("mysql change feed: reading the binary log position: %w", errors.Join(errs...))
}

// decodeRows decodes a rows event only when it is the head table's.
func (f *binlogFeed) decodeRows(e *replication.RowsEvent, data []byte) error {
	pos, err := e.DecodeHeader(data)
	if err != nil {
		return err
	}
	if string(e.Table.Table) != headTable || string(e.Table.Schema) != f.schema {
		return nil
	}
	return e.DecodeData(pos, data)
}

// stream reads the binary log from f.pos until an error or ctx ends,
// reporting each committed transaction's head changes. f.pos follows the
// commits read, so that a reconnect never starts inside a transaction.
func (f *binlogFeed) stream(ctx context.Context, sink driver.FeedSink) error {
	f.streamed = false
	syncer := replication.NewBinlogSyncer(f.cfg)
	defer syncer.Close()
	st, err := syncer.StartSync(f.pos)
	if err != nil {
		return err
	}
	tx := &feedTx{index: map[[3]string]int{}}
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return err
		}
		if !f.streamed {
			// The server accepted the position: its first event (a
			// rotate naming the file) has arrived.
			f.streamed = true
			sink.Up(true)
		}
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			f.pos = gomysql.Position{Name: string(e.NextLogName), Pos: uint32(e.Position)}
		case *replication.RowsEvent:
			if e.Table != nil && e.Rows != nil && string(e.Table.Table) == headTable && string(e.Table.Schema) == f.schema {
				f.heads(e, tx)
			}
		case *replication.XIDEvent:
			f.pos.Pos = ev.Header.LogPos
			tx.commit(sink)
		case *replication.QueryEvent:
			if q := string(e.Query); q != "BEGIN" {
				f.pos.Pos = ev.Header.LogPos // DDL and other statements commit on their own
				if q == "COMMIT" {
					tx.commit(sink)
				}
			}
		case *replication.GenericEvent:
			switch typ, size, skipped := skippedEvent(ev.Header.EventType, e.Data); {
			case skipped:
				f.skipped(sink, typ, size)
				// It may have held a head change, so consumers read their
				// heads again, as after a lost position: once the
				// transaction that held it commits, or at once when it
				// was a whole (compressed) transaction.
				tx.rescan = true
				if typ == replication.TRANSACTION_PAYLOAD_EVENT {
					tx.commit(sink)
				}
			case ev.Header.EventType == replication.HEARTBEAT_EVENT || ev.Header.EventType == replication.HEARTBEAT_LOG_EVENT_V2:
				tx.flushRescan(sink) // the server is idle: whatever held the skipped event has committed
			}
		}
	}
}

// skipped notes a skipped event: one line a minute at most, with how
// many since the last.
func (f *binlogFeed) skipped(sink driver.FeedSink, typ replication.EventType, size uint32) {
	f.skips++
	if now := time.Now(); now.Sub(f.skipNoted) >= time.Minute {
		sink.Note("shardq: change feed passed over binary log events above its size bound (FeedMaxEventBytes); consumers rescan",
			"events", f.skips, "last_type", typ.String(), "last_bytes", size, "max_bytes", f.d.feedMax)
		f.skips, f.skipNoted = 0, now
	}
}

// heads adds the partitions e's row images name to tx, once each with
// the highest head seen. An UPDATE lists a before and an after image; with
// binlog_row_image=MINIMAL only the before image holds the key and only
// the after image the new head.
func (f *binlogFeed) heads(e *replication.RowsEvent, tx *feedTx) {
	prev := -1 // the partition of the previous image
	for _, row := range e.Rows {
		h, ok := f.head(row)
		if !ok {
			if prev >= 0 {
				tx.heads[prev].Head = max(tx.heads[prev].Head, h.Head) // an after image without the key
			}
			continue
		}
		k := [3]string{h.Tenant, h.Topic, h.PartitionKey}
		i, seen := tx.index[k]
		if !seen {
			i = len(tx.heads)
			tx.index[k] = i
			tx.heads = append(tx.heads, h)
		}
		tx.heads[i].Head = max(tx.heads[i].Head, h.Head)
		prev = i
	}
}

// feedTx is the head changes of the transaction being read.
type feedTx struct {
	heads []driver.HeadChange
	index map[[3]string]int
	// rescan: an event of it was passed over unread (too large), so its
	// commit is reported as a Rescan.
	rescan bool
}

// commit reports the transaction's changes, if any, and starts the next.
func (tx *feedTx) commit(sink driver.FeedSink) {
	if len(tx.heads) > 0 {
		sink.Moved(tx.heads)
		tx.heads, tx.index = nil, map[[3]string]int{}
	}
	tx.flushRescan(sink)
}

func (tx *feedTx) flushRescan(sink driver.FeedSink) {
	if tx.rescan {
		sink.Rescan()
		tx.rescan = false
	}
}

// head reads one row image; ok is false when it lacks the key columns.
func (f *binlogFeed) head(row []any) (driver.HeadChange, bool) {
	at := func(i int) any {
		if i < len(row) {
			return row[i]
		}
		return nil
	}
	var h driver.HeadChange
	switch v := at(f.cols.head).(type) {
	case int64:
		h.Head = v
	case uint64:
		h.Head = int64(v)
	}
	var ok [3]bool
	h.Tenant, ok[0] = text(at(f.cols.tenant))
	h.Topic, ok[1] = text(at(f.cols.topic))
	h.PartitionKey, ok[2] = text(at(f.cols.key))
	return h, ok[0] && ok[1] && ok[2]
}

func text(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// go-mysql reads each binary log event whole into memory, and the server
// streams the events of every database on it, so one huge row of another
// application (up to max_allowed_packet, 1 GiB) would be allocated in
// every consuming process. go-mysql has no bound of its own: no event or
// packet size setting, no hook before a packet's body is read. Its
// Option hook runs once the connection is established (after the
// handshake, and TLS), before the dump starts, so there boundEvents puts
// eventBound between go-mysql and the connection, where the MySQL
// packets pass in the clear.

// boundEvents makes c pass over binary log events larger than max.
func boundEvents(c *client.Conn, max uint32, readTimeout time.Duration) {
	if c.Conn.Compression != gomysql.MYSQL_COMPRESS_NONE {
		return // never negotiated by the syncer: packets would not be readable here
	}
	c.Conn.Conn = &eventBound{Conn: c.Conn.Conn, max: max, readTimeout: readTimeout}
}

// skipMarker starts the body of the stand-in for an event passed over;
// the original event's type (1 byte) and size (4 bytes) follow.
const skipMarker = "shardq: event skipped"

// Event types the feed reads whatever their size (each is small): the
// parser needs them (the format description for checksums and header
// lengths, a table map for the rows events naming its table), and the
// feed's position and commits the rotate and the XID.
func mustRead(typ replication.EventType) bool {
	switch typ {
	case replication.FORMAT_DESCRIPTION_EVENT, replication.TABLE_MAP_EVENT, replication.ROTATE_EVENT, replication.XID_EVENT:
		return true
	}
	return false
}

// skippedEvent reads a stand-in's body: the type and size of the event
// passed over.
func skippedEvent(typ replication.EventType, data []byte) (replication.EventType, uint32, bool) {
	if typ != replication.IGNORABLE_EVENT || !strings.HasPrefix(string(data), skipMarker) || len(data) < len(skipMarker)+5 {
		return 0, 0, false
	}
	body := data[len(skipMarker):]
	return replication.EventType(body[0]), binary.LittleEndian.Uint32(body[1:]), true
}

// eventBound is the replica connection as go-mysql reads it. Until the
// client sends the dump command it passes everything. Then it reads each
// packet's header, and the first bytes of an event packet (the OK byte
// and the 19-byte event header): an event larger than max is replaced by
// a small stand-in of type IGNORABLE_EVENT with the same header otherwise
// (position, timestamp) and skipMarker in its body, and its bytes, in
// this packet and the ones it continues into, are read and dropped as
// they arrive. Later packets' sequence numbers are shifted back by the
// packets dropped, as go-mysql checks them.
type eventBound struct {
	net.Conn
	max         uint32
	readTimeout time.Duration // per read while dropping: the progress, not the whole event, is bounded
	dumping     atomic.Bool   // the dump command was sent

	pending []byte // to hand to the reader before reading on
	pass    int    // bytes of the current packet to pass through
	drop    int    // bytes of the current packet to drop
	cont    byte   // the current packet continues in the next one: contPass or contDrop (0: no)
	seqDrop byte   // packets dropped so far
	buf     []byte // for dropped bytes
}

const (
	contPass = 1 + iota
	contDrop
	eventHeaderSize = replication.EventHeaderSize
	checksumSize    = replication.BinlogChecksumLength
)

func (c *eventBound) Write(p []byte) (int, error) {
	// go-mysql writes one packet per call; a dump command opens the
	// stream: COM_BINLOG_DUMP or COM_BINLOG_DUMP_GTID, sequence 0.
	if len(p) > 4 && p[3] == 0 && (p[4] == gomysql.COM_BINLOG_DUMP || p[4] == gomysql.COM_BINLOG_DUMP_GTID) &&
		int(p[0])|int(p[1])<<8|int(p[2])<<16 == len(p)-4 {
		defer c.dumping.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *eventBound) Read(p []byte) (int, error) {
	if !c.dumping.Load() || len(p) == 0 {
		return c.Conn.Read(p)
	}
	for {
		switch {
		case len(c.pending) > 0:
			n := copy(p, c.pending)
			c.pending = c.pending[n:]
			return n, nil
		case c.pass > 0:
			n, err := c.Conn.Read(p[:min(len(p), c.pass)])
			c.pass -= n
			return n, err
		case c.drop > 0:
			if err := c.dropBytes(); err != nil {
				return 0, err
			}
		default:
			if err := c.nextPacket(); err != nil {
				return 0, err
			}
		}
	}
}

// nextPacket reads the next packet's header (and an event's header) and
// decides what becomes of its bytes.
func (c *eventBound) nextPacket() error {
	var h [4]byte
	if _, err := io.ReadFull(c.Conn, h[:]); err != nil {
		return err
	}
	length := int(h[0]) | int(h[1])<<8 | int(h[2])<<16
	h[3] -= c.seqDrop
	last := length < gomysql.MaxPayloadLen // else the reply continues in the next packet
	switch c.cont {
	case contDrop:
		c.seqDrop++
		c.drop = length
	case contPass:
		c.pending, c.pass = h[:], length
	default:
		head := make([]byte, 4+min(length, 1+eventHeaderSize))
		copy(head, h[:])
		if _, err := io.ReadFull(c.Conn, head[4:]); err != nil {
			return err
		}
		rest := length - (len(head) - 4)
		if ev := head[5:]; head[4] == gomysql.OK_HEADER && len(ev) == eventHeaderSize {
			typ, size := replication.EventType(ev[4]), binary.LittleEndian.Uint32(ev[9:])
			if size > c.max && !mustRead(typ) {
				c.pending, c.drop = standIn(h[3], ev, typ, size), rest
				c.cont = 0
				if !last {
					c.cont = contDrop
				}
				return nil
			}
		}
		c.pending, c.pass = head, rest
		if !last {
			c.cont = contPass
		}
		return nil
	}
	if last {
		c.cont = 0
	}
	return nil
}

// dropBytes reads and drops the rest of the current packet.
func (c *eventBound) dropBytes() error {
	if c.buf == nil {
		c.buf = make([]byte, 64<<10)
	}
	for c.drop > 0 {
		if c.readTimeout > 0 {
			if err := c.Conn.SetReadDeadline(time.Now().Add(c.readTimeout)); err != nil {
				return err
			}
		}
		n, err := c.Conn.Read(c.buf[:min(len(c.buf), c.drop)])
		c.drop -= n
		if err != nil {
			return err
		}
	}
	return nil
}

// standIn is the packet that replaces an event passed over: an
// IGNORABLE_EVENT with the original's header otherwise, skipMarker, the
// original's type and size, and a CRC32 checksum (go-mysql strips or
// checks one when the server writes them; without, it is body).
func standIn(seq byte, header []byte, typ replication.EventType, size uint32) []byte {
	evLen := eventHeaderSize + len(skipMarker) + 5 + checksumSize
	p := make([]byte, 4+1+evLen)
	p[0], p[1], p[2], p[3] = byte(1+evLen), byte((1+evLen)>>8), byte((1+evLen)>>16), seq
	p[4] = gomysql.OK_HEADER
	ev := p[5:]
	copy(ev, header)
	ev[4] = byte(replication.IGNORABLE_EVENT)
	binary.LittleEndian.PutUint32(ev[9:], uint32(evLen))
	body := ev[eventHeaderSize:]
	copy(body, skipMarker)
	body[len(skipMarker)] = byte(typ)
	binary.LittleEndian.PutUint32(body[len(skipMarker)+1:], size)
	binary.LittleEndian.PutUint32(ev[evLen-checksumSize:], crc32.ChecksumIEEE(ev[:evLen-checksumSize]))
	return p
}
