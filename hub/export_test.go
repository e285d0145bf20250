package hub

// NoSaveOnStop makes h stop as a crashed replica would as far as its
// snapshot goes: no last save (the catalog's last write still happens).
// Tests of cold starts need a snapshot that lacks clusters.
func (h *Hub) NoSaveOnStop() { h.coord.noSaveOnStop.Store(true) }
