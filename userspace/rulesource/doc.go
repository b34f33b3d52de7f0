// Package rulesource follows a rules document kept in Redis, for a fleet of
// hosts that share their rules.
//
// The document is the YAML of a rules file, stored as a string at a key
// (default xlimit:rules). Beside it, KEY:version holds an integer that every
// push increments, and each push PUBLISHes the new version on a channel
// (default xlimit:rules). Push does all three in one Lua script, so a reader
// never sees a document without its version.
//
// A Source subscribes to the channel first and then reads the key, so no push
// between the two is missed; it reads the key again on every message and,
// because pub/sub messages can be lost (a subscriber that is reconnecting, a
// Redis Cluster node that did not forward a PUBLISH, an operator who SET the
// key by hand), every resync interval as well. It hands over a document only
// when its content or version differs from the last one handed over. On any
// error it drops the connection, reports itself down and reconnects with
// exponential backoff; the caller keeps the rules it has.
//
// The Source knows Redis only through the Store interface, so its logic is
// tested with a fake store under testing/synctest.
package rulesource
