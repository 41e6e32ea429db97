package cluster

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestEtcdStore checks EtcdStore against what Store promises.
func TestEtcdStore(t *testing.T) {
	cli, prefix := etcd(t)
	testStore(t, NewEtcdStore(cli), prefix)
}

// testStore checks the promises of Store's doc comments that the fleet
// relies on (docs/fleet-store.md), on keys under prefix: any Store should
// pass it.
func testStore(t *testing.T, st Store, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b, node := prefix+"r/a", prefix+"r/b", prefix+"n/1"

	// Create once: absent holds for the first commit only; the failed
	// one returns the key as it is.
	ok, _, err := st.Commit(ctx, []Fence{absent(a)}, []Op{put(a, []byte("1"))}, a)
	if err != nil || !ok {
		t.Fatalf("first create of %s = %v, %v; want applied", a, ok, err)
	}
	ok, got, err := st.Commit(ctx, []Fence{absent(a)}, []Op{put(a, []byte("2"))}, a, b)
	if err != nil || ok {
		t.Fatalf("second create of %s = %v, %v; want refused", a, ok, err)
	}
	if got[0] == nil || string(got[0].Value) != "1" || got[1] != nil {
		t.Errorf("else-get after the refused create = %v, %v; want %s=1 and %s absent", got[0], got[1], a, b)
	}

	// Unchanged holds until the key is written again.
	kv, err := getKey(ctx, st, a)
	if err != nil || kv == nil {
		t.Fatalf("get %s = %v, %v", a, kv, err)
	}
	if ok, _, err := st.Commit(ctx, []Fence{unchanged(a, kv.ModRevision)}, []Op{put(a, []byte("3"))}); err != nil || !ok {
		t.Fatalf("write of %s unchanged since read = %v, %v; want applied", a, ok, err)
	}
	if err := deleteUnchanged(ctx, st, *kv); err != nil {
		t.Fatal(err)
	}
	if kv2, err := getKey(ctx, st, a); err != nil || kv2 == nil || string(kv2.Value) != "3" {
		t.Errorf("%s after a delete fenced on a stale revision = %v, %v; want it kept with 3", a, kv2, err)
	}

	// Present, and a failed fence applies none of the ops.
	if ok, _, err := st.Commit(ctx, []Fence{present(a), present(b)}, []Op{put(a, []byte("4")), put(b, []byte("4"))}); err != nil || ok {
		t.Fatalf("commit fenced on absent %s present = %v, %v; want refused", b, ok, err)
	}
	if kv, _ := getKey(ctx, st, a); kv == nil || string(kv.Value) != "3" {
		t.Errorf("%s after a refused commit = %v; want 3, unchanged", a, kv)
	}

	// Read of several ranges at one revision, keys ordered.
	if ok, _, err := st.Commit(ctx, nil, []Op{put(b, []byte("5"))}); err != nil || !ok {
		t.Fatalf("unfenced put = %v, %v", ok, err)
	}
	rev, found, err := st.Read(ctx, prefixRange(prefix+"r/"), keyRange(node))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 || len(found[0]) != 2 || found[0][0].Key != a || found[0][1].Key != b || len(found[1]) != 0 {
		t.Errorf("read of %sr/ and %s = %v; want [%s %s] and nothing", prefix, node, found, a, b)
	}
	if rev < found[0][1].ModRevision {
		t.Errorf("read's revision %d is before its keys' (%d)", rev, found[0][1].ModRevision)
	}

	// A watch from that revision sees the later changes in order.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := st.Watch(wctx, prefix+"r/", rev)
	if ok, _, err := st.Commit(ctx, nil, []Op{del(a), put(b, []byte("6"))}); err != nil || !ok {
		t.Fatalf("delete and put = %v, %v", ok, err)
	}
	wb := <-w
	if wb.Err != nil || len(wb.Events) != 2 || !wb.Events[0].Deleted || wb.Events[0].KV.Key != a ||
		wb.Events[1].Deleted || wb.Events[1].KV.Key != b || string(wb.Events[1].KV.Value) != "6" {
		t.Errorf("watch batch = %+v; want the delete of %s and %s=6", wb, a, b)
	}

	// A lease: its keys go when it is revoked; the fence on it holds
	// while the key is under it.
	lease, err := st.Grant(ctx, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := st.Commit(ctx, []Fence{absent(node)}, []Op{putLeased(node, []byte("n"), lease)}); err != nil || !ok {
		t.Fatalf("put under lease = %v, %v", ok, err)
	}
	if kv, _ := getKey(ctx, st, node); kv == nil || kv.Lease != lease {
		t.Errorf("%s = %v; want it under lease %x", node, kv, lease)
	}
	if ok, _, err := st.Commit(ctx, []Fence{leasedBy(node, lease)}, []Op{put(b, []byte("7"))}); err != nil || !ok {
		t.Errorf("commit fenced on the live lease = %v, %v; want applied", ok, err)
	}
	if remaining, granted, err := st.LeaseRemaining(ctx, lease); err != nil || remaining <= 0 || granted != 2*time.Second {
		t.Errorf("LeaseRemaining = %v, %v, %v; want > 0 of 2s", remaining, granted, err)
	}
	if err := st.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if kv, _ := getKey(ctx, st, node); kv != nil {
		t.Errorf("%s after its lease was revoked = %v; want it gone", node, kv)
	}
	if ok, _, err := st.Commit(ctx, []Fence{leasedBy(node, lease)}, []Op{put(b, []byte("8"))}); err != nil || ok {
		t.Errorf("commit fenced on the revoked lease = %v, %v; want refused", ok, err)
	}
	if remaining, _, err := st.LeaseRemaining(ctx, lease); err != nil || remaining > 0 {
		t.Errorf("LeaseRemaining of the revoked lease = %v, %v; want <= 0", remaining, err)
	}
	if err := st.Revoke(ctx, lease); !errors.Is(err, ErrLeaseNotFound) {
		t.Errorf("second Revoke = %v; want ErrLeaseNotFound", err)
	}

	// A lease kept alive outlives its time; its keep-alive ends with
	// its context.
	lease, err = st.Grant(ctx, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx, kcancel := context.WithCancel(ctx)
	ended, err := st.KeepAlive(kctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if remaining, _, err := st.LeaseRemaining(ctx, lease); err != nil || remaining <= 0 {
			t.Fatalf("LeaseRemaining of a lease kept alive = %v, %v", remaining, err)
		}
		select {
		case <-ended:
			t.Fatal("keep-alive ended while its context lives")
		case <-time.After(500 * time.Millisecond):
		}
	}
	kcancel()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Error("keep-alive did not end within 5s of its context")
	}
	st.Revoke(ctx, lease)
}
