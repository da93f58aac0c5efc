// Package kafkatest has what tests of Kafka records need: the Java
// client's partitioner written out from Kafka's source, so the sink's
// placement is checked against the formula and not against the library
// (kgo) that implements it, and an independent reader of a topic in either
// isolation level.
package kafkatest

// JavaMurmur2 is Kafka's org.apache.kafka.common.utils.Utils.murmur2.
func JavaMurmur2(data []byte) int32 {
	const (
		seed = uint32(0x9747b28c)
		m    = uint32(0x5bd1e995)
		r    = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// JavaPartition is the Java client's default placement of a keyed record:
// (murmur2(key) & 0x7fffffff) % partitions.
func JavaPartition(key string, partitions int) int {
	return int(JavaMurmur2([]byte(key))&0x7fffffff) % partitions
}
