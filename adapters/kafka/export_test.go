package kafka

// SetStall installs a hook that runs before a transaction's first record
// is sent (stage "send") and before its commit ("commit"): a relay that
// stalls there, as a SIGSTOP or a long pause would stall it.
func (s *ExactlyOnceSink) SetStall(f func(stage string)) { s.stall = f }
