package configs

import "fmt"

// Sink selects and configures the broker the relay publishes to and the
// consumers read from.
type Sink struct {
	// Kind is one of SinkKinds.
	Kind     string       `koanf:"kind"`
	Kafka    KafkaSink    `koanf:"kafka"`
	NATS     NATSSink     `koanf:"nats"`
	AMQP     AMQPSink     `koanf:"amqp"`
	Redis    RedisSink    `koanf:"redis"`
	Postgres PostgresSink `koanf:"postgres"`
	// CommandTopicPrefix prefixes a command's service: commands.<service>.
	CommandTopicPrefix string `koanf:"command_topic_prefix"`
}

// KafkaSink configures the Kafka sink.
type KafkaSink struct {
	Brokers []string `koanf:"brokers"`
}

// NATSSink configures the NATS JetStream sink.
type NATSSink struct {
	URL string `koanf:"url"`
}

// AMQPSink configures the RabbitMQ sink.
type AMQPSink struct {
	URL string `koanf:"url"`
}

// RedisSink configures the Redis Streams sink.
type RedisSink struct {
	Addr string `koanf:"addr"`
}

// PostgresSink configures the sink that writes into another Postgres database.
type PostgresSink struct {
	URL string `koanf:"url"`
}

// SinkKinds are the accepted values of sink.kind.
var SinkKinds = []string{"kafka", "memory"}

func defaultSink() Sink {
	return Sink{
		Kind:               "kafka",
		Kafka:              KafkaSink{Brokers: []string{"127.0.0.1:9092"}},
		CommandTopicPrefix: "commands.",
	}
}

func (s Sink) validate() error {
	known := false
	for _, k := range SinkKinds {
		known = known || s.Kind == k
	}
	if !known {
		return fieldErr("sink.kind", "is %q, want one of %v", s.Kind, SinkKinds)
	}
	if s.Kind == "kafka" && len(s.Kafka.Brokers) == 0 {
		return fieldErr("sink.kafka.brokers", "is required when sink.kind is kafka")
	}
	for i, b := range s.Kafka.Brokers {
		if err := validateAddr(fmt.Sprintf("sink.kafka.brokers[%d]", i), b, false); err != nil {
			return err
		}
	}
	if s.CommandTopicPrefix == "" {
		return fieldErr("sink.command_topic_prefix", "is required")
	}
	return nil
}
