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

	testStoreOps(t, ctx, st, prefix+"ops/")
}

// testStoreOps checks the promises of Store's named operations
// (ClaimSandbox, ForgetLost, RemoveNode) on keys under prefix.
func testStoreOps(t *testing.T, ctx context.Context, st Store, prefix string) {
	k := keys{prefix}
	value := func(key string) string {
		t.Helper()
		kv, err := getKey(ctx, st, key)
		if err != nil {
			t.Fatal(err)
		}
		if kv == nil {
			return "<absent>"
		}
		return string(kv.Value)
	}
	lease, err := st.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Revoke(ctx, lease)
	if ok, _, err := st.Commit(ctx, []Fence{absent(k.node("n"))}, []Op{putLeased(k.node("n"), []byte("n0"), lease)}); err != nil || !ok {
		t.Fatalf("register n = %v, %v", ok, err)
	}
	claim := func(id, record, nodeRecord string, adopting bool) SandboxClaim {
		return SandboxClaim{Key: k.sandbox(id), Record: []byte(record), NodeKey: k.node("n"), NodeRecord: []byte(nodeRecord),
			Lease: lease, DrainKey: k.drain("n"), Adopting: adopting}
	}

	// ClaimSandbox: once per id, the node's record with it under the
	// lease; a second claim reports the holder and writes nothing.
	if ok, holder, draining, err := st.ClaimSandbox(ctx, claim("s1", "n", "n1", false)); err != nil || !ok || holder != nil || draining {
		t.Fatalf("first claim of s1 = %v, %v, %v, %v; want claimed", ok, holder, draining, err)
	}
	if kv, _ := getKey(ctx, st, k.node("n")); kv == nil || string(kv.Value) != "n1" || kv.Lease != lease {
		t.Errorf("node key after the claim = %v; want n1 under lease %x", kv, lease)
	}
	ok, holder, draining, err := st.ClaimSandbox(ctx, claim("s1", "m", "n2", false))
	if err != nil || ok || holder == nil || string(holder.Value) != "n" || draining {
		t.Errorf("second claim of s1 = %v, %v, %v, %v; want refused with the holder n", ok, holder, draining, err)
	}
	if got := value(k.sandbox("s1")) + " " + value(k.node("n")); got != "n n1" {
		t.Errorf("s1 and node after the refused claim = %s; want n n1", got)
	}

	// A drain mark refuses new claims, not adoptions.
	if ok, _, err := st.Commit(ctx, nil, []Op{put(k.drain("n"), []byte("d"))}); err != nil || !ok {
		t.Fatalf("drain n = %v, %v", ok, err)
	}
	if ok, holder, draining, err := st.ClaimSandbox(ctx, claim("s2", "n", "n3", false)); err != nil || ok || holder != nil || !draining {
		t.Errorf("claim of s2 while n drains = %v, %v, %v, %v; want refused, draining", ok, holder, draining, err)
	}
	if got := value(k.sandbox("s2")) + " " + value(k.node("n")); got != "<absent> n1" {
		t.Errorf("s2 and node after the refused claim = %s; want <absent> n1", got)
	}
	if ok, _, _, err := st.ClaimSandbox(ctx, claim("s2", "n", "n4", true)); err != nil || !ok {
		t.Errorf("adoption of s2 while n drains = %v, %v; want claimed", ok, err)
	}

	// Without the lease nothing is claimed, adopting or not, and neither
	// a holder nor a drain mark is reported.
	if ok, _, err := st.Commit(ctx, nil, []Op{del(k.drain("n"))}); err != nil || !ok {
		t.Fatalf("undrain n = %v, %v", ok, err)
	}
	if err := st.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, adopting := range []bool{false, true} {
		if ok, holder, draining, err := st.ClaimSandbox(ctx, claim("s3", "n", "n5", adopting)); err != nil || ok || holder != nil || draining {
			t.Errorf("claim of s3 (adopting %v) after the lease ended = %v, %v, %v, %v; want refused, no holder, not draining", adopting, ok, holder, draining, err)
		}
	}
	if got := value(k.sandbox("s3")) + " " + value(k.node("n")); got != "<absent> <absent>" {
		t.Errorf("s3 and node after the claim without lease = %s; want both absent", got)
	}

	// ForgetLost: only the record as read, only while the node is lost;
	// then the record goes and the tombstone comes, together.
	kv, err := getKey(ctx, st, k.sandbox("s1"))
	if err != nil || kv == nil {
		t.Fatalf("get s1 = %v, %v", kv, err)
	}
	forget := LostSandbox{Key: kv.Key, Revision: kv.ModRevision, NodeKey: k.node("n"), TombstoneKey: k.tombstone("n", "s1"), Tombstone: []byte("t")}
	stale := forget
	stale.Revision--
	if ok, err := st.ForgetLost(ctx, stale); err != nil || ok {
		t.Errorf("ForgetLost of a record changed since read = %v, %v; want refused", ok, err)
	}
	if ok, _, err := st.Commit(ctx, nil, []Op{put(k.node("n"), []byte("back"))}); err != nil || !ok {
		t.Fatalf("n back = %v, %v", ok, err)
	}
	if ok, err := st.ForgetLost(ctx, forget); err != nil || ok {
		t.Errorf("ForgetLost while the node is back = %v, %v; want refused", ok, err)
	}
	if got := value(k.sandbox("s1")) + " " + value(k.tombstone("n", "s1")); got != "n <absent>" {
		t.Errorf("s1 and its tombstone after the refused ForgetLost = %s; want n <absent>", got)
	}
	if ok, _, err := st.Commit(ctx, nil, []Op{del(k.node("n"))}); err != nil || !ok {
		t.Fatalf("n lost again = %v, %v", ok, err)
	}
	if ok, err := st.ForgetLost(ctx, forget); err != nil || !ok {
		t.Errorf("ForgetLost = %v, %v; want forgotten", ok, err)
	}
	if got := value(k.sandbox("s1")) + " " + value(k.tombstone("n", "s1")); got != "<absent> t" {
		t.Errorf("s1 and its tombstone after ForgetLost = %s; want <absent> t", got)
	}

	// RemoveNode: refused while the node is registered, or a record
	// changed since read (the node's own keys stay); else everything goes.
	for _, key := range []string{k.seen("n"), k.drain("n"), k.snapshot("p1"), k.snapshot("p2"), k.sandbox("s4")} {
		if ok, _, err := st.Commit(ctx, nil, []Op{put(key, []byte("x"))}); err != nil || !ok {
			t.Fatalf("put %s = %v, %v", key, ok, err)
		}
	}
	_, found, err := st.Read(ctx, prefixRange(k.sandboxes()))
	if err != nil || len(found[0]) != 2 {
		t.Fatalf("read of the records = %v, %v; want s2 and s4", found, err)
	}
	removal := NodeRemoval{NodeKey: k.node("n"), Snapshots: []string{k.snapshot("p1"), k.snapshot("p2")}, Records: found[0],
		Keys: []string{k.seen("n"), k.drain("n")}, Prefixes: []string{k.tombstones("n")}}
	kept := func(what string, keys ...string) {
		t.Helper()
		for _, key := range keys {
			if value(key) == "<absent>" {
				t.Errorf("%s: %s removed; want it kept", what, key)
			}
		}
	}
	if ok, _, err := st.Commit(ctx, nil, []Op{put(k.node("n"), []byte("back"))}); err != nil || !ok {
		t.Fatalf("n back = %v, %v", ok, err)
	}
	if done, err := st.RemoveNode(ctx, removal); err != nil || done != (NodeRemoved{}) {
		t.Errorf("RemoveNode of a registered node = %+v, %v; want nothing removed", done, err)
	}
	kept("registered node", k.snapshot("p1"), k.snapshot("p2"), k.sandbox("s4"), k.seen("n"), k.drain("n"), k.tombstone("n", "s1"))
	if ok, _, err := st.Commit(ctx, nil, []Op{del(k.node("n")), put(k.sandbox("s4"), []byte("y"))}); err != nil || !ok {
		t.Fatalf("n lost and s4 rewritten = %v, %v", ok, err)
	}
	if done, err := st.RemoveNode(ctx, removal); err != nil || done.Done || done.Records == len(removal.Records) {
		t.Errorf("RemoveNode with a record changed = %+v, %v; want not done", done, err)
	}
	kept("a record changed", k.sandbox("s4"), k.seen("n"), k.drain("n"), k.tombstone("n", "s1"))
	_, found, err = st.Read(ctx, prefixRange(k.sandboxes()))
	if err != nil {
		t.Fatal(err)
	}
	removal.Records = found[0]
	if done, err := st.RemoveNode(ctx, removal); err != nil || !done.Done || done.Records != len(found[0]) {
		t.Errorf("RemoveNode = %+v, %v; want done with %d records", done, err, len(found[0]))
	}
	if _, found, err := st.Read(ctx, prefixRange(prefix)); err != nil || len(found[0]) != 0 {
		t.Errorf("keys after RemoveNode = %v, %v; want none", found, err)
	}
}
