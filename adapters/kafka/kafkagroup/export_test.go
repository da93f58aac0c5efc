package kafkagroup

// IgnoreFenced switches the fenced member's stop off (true) for a negative
// control, and back on.
func IgnoreFenced(on bool) { ignoreFenced.Store(on) }
