package federation

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Chunker packs the items of an update (shards, imports, service keys) into
// messages of at most Budget bytes, in order: a spoke's updates, the hub's
// import updates and a replica's updates are all chunked by it. Each item
// counts exactly what it takes on the wire (ItemBytes).
type Chunker struct {
	Budget int
	size   int
}

// Next counts an item of n bytes and reports whether it starts a new chunk:
// the current one holds something and the item would take it past the
// budget. An item larger than the budget alone gets a chunk of its own.
func (c *Chunker) Next(n int) bool {
	if c.size > 0 && c.size+n > c.Budget {
		c.size = n
		return true
	}
	c.size += n
	return false
}

// ItemBytes is what m takes on the wire as an element of a repeated message
// field numbered 1 to 15 (every update's upserts, removes and retains).
func ItemBytes(m proto.Message) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(m))
}
