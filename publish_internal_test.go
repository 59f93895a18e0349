// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/testdb"
)

// chunksAfterMarker is a driver whose chunk insert ends the writer's
// context (its client goes away while the chunks' transaction runs) and
// then waits, before it locks anything, until an aborted end marker was
// inserted or a moment passed: where the marker's transaction may run
// beside the chunks' (MariaDB runs a tenant's publish transactions two at
// a time), it then commits first.
type chunksAfterMarker struct {
	driver.Driver
	cancel context.CancelFunc
	once   sync.Once
	marker chan struct{}
}

func (d *chunksAfterMarker) InsertMessages(ctx context.Context, tx driver.DBTX, rows []*driver.InsertMessage) error {
	switch {
	case rows[0].Headers[large.HeaderChunk] != "":
		d.cancel()
		select {
		case <-d.marker:
		case <-time.After(200 * time.Millisecond): // no marker beside it
		}
	case rows[0].Headers[large.HeaderAborted] == "true":
		// Inserted, its transaction holds the partition's head until
		// it commits: the chunks then come after it.
		defer d.once.Do(func() { close(d.marker) })
	}
	return d.Driver.InsertMessages(ctx, tx, rows)
}

// A large write whose context ends while its chunks' transaction runs
// waits for that transaction before it stores its aborted end marker: the
// marker never commits ahead of the write's own chunks, which readers
// would take for a write still in progress.
func TestLargeWriteAbortedAfterItsChunks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drv := &chunksAfterMarker{Driver: testdb.Migrated(t, testdb.MySQL(t)), cancel: cancel, marker: make(chan struct{})}
	c, err := NewClient(drv, &Config{TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.PublishLarge(ctx, Message{Tenant: "t", Topic: "files", PartitionKey: "k", ID: "big"}, bytes.NewReader(make([]byte, 3000)),
		&LargeOptions{ChunkSize: 1000, ChunksPerTx: 16})
	if err == nil {
		t.Fatal("a write whose context ended succeeded")
	}
	c.Close() // lets every queued publish end
	ms, _, err := drv.FetchWithin(context.Background(), driver.FetchWithinParams{Partition: driver.TopicPartition{Tenant: "t", Topic: "files", PartitionKey: "k"}, After: 0, Limit: 100, Budget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for j, m := range ms {
		if m.ID == "big" && j != len(ms)-1 {
			t.Fatalf("the aborted end marker at offset %d comes before %s at %d", m.Offset, ms[len(ms)-1].ID, ms[len(ms)-1].Offset)
		}
	}
}
