package main

import (
	"fmt"

	"github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers"
)

// brokerConfig maps sink.* onto the brokers package's settings. Only
// sink.kind's own settings are mapped and only its TLS files read: the
// other kinds' keys may hold anything, as configs' validation allows.
// Errors name the configuration key.
func brokerConfig(s configs.Sink) (brokers.Config, error) {
	c := brokers.Config{Kind: s.Kind}
	var err error
	switch s.Kind {
	case "kafka":
		c.Kafka = kafka.Config{Brokers: s.Kafka.Brokers, Partitioner: s.Kafka.Partitioner,
			ExactlyOnce: s.Kafka.ExactlyOnce, TransactionalIDPrefix: s.Kafka.TransactionalIDPrefix, Security: kafka.Security{
				SASLMechanism: s.Kafka.SASL.Mechanism, SASLUser: s.Kafka.SASL.Username, SASLPassword: s.Kafka.SASL.Password}}
		c.Kafka.Security.TLS, err = s.Kafka.TLS.Load("sink.kafka.tls")
	case "nats":
		c.NATS = nats.Config{URL: s.NATS.URL, Username: s.NATS.Username, Password: s.NATS.Password,
			Token: s.NATS.Token, SubjectPrefix: s.NATS.SubjectPrefix}
		c.NATS.TLS, err = s.NATS.TLS.Load("sink.nats.tls")
	case "amqp":
		c.AMQP = amqp.Config{URL: s.AMQP.URL, Username: s.AMQP.Username, Password: s.AMQP.Password,
			ExchangePrefix: s.AMQP.ExchangePrefix, Consumers: s.AMQP.Consumers, MaxPayloadBytes: s.AMQP.MaxPayloadBytes,
			CommandTopicPrefix: s.CommandTopicPrefix, CommandOwners: s.AMQP.CommandOwners}
		c.AMQP.TLS, err = s.AMQP.TLS.Load("sink.amqp.tls")
	case "redis":
		c.Redis = redisstream.Config{Addr: s.Redis.Addr, Username: s.Redis.Username, Password: s.Redis.Password,
			DB: s.Redis.DB, StreamPrefix: s.Redis.StreamPrefix, MaxPayloadBytes: s.Redis.MaxPayloadBytes}
		c.Redis.TLS, err = s.Redis.TLS.Load("sink.redis.tls")
	case "postgres":
		c.Postgres = sqlsink.Config{URL: s.Postgres.URL, MaxPayloadBytes: s.Postgres.MaxPayloadBytes}
	}
	return c, err
}

// brokerKeys is the configuration key an error of a kind's sink or
// subscribers is about: the setting its connection is opened with (Kafka's
// also come from its partitioner and SASL settings). The brokers package's
// errors never quote a URL, so neither does the wrapped error.
var brokerKeys = map[string]string{
	"kafka":    "sink.kafka",
	"nats":     "sink.nats.url",
	"amqp":     "sink.amqp.url",
	"redis":    "sink.redis.addr",
	"postgres": "sink.postgres.url",
}

// openBroker maps s and opens one end of its broker with open; an error
// of open names the key it is about (brokerKeys).
func openBroker[T any](s configs.Sink, open func(brokers.Config) (T, error)) (T, error) {
	var none T
	c, err := brokerConfig(s)
	if err != nil {
		return none, err
	}
	end, err := open(c)
	if err != nil {
		key, ok := brokerKeys[s.Kind]
		if !ok {
			key = "sink.kind" // an unknown kind, or memory outside one process
		}
		return none, fmt.Errorf("config key %s: %w", key, err)
	}
	return end, nil
}

// openSubscribers returns the consumers' subscribers configured by sink.*,
// which read what openSink's sink (relay.go) publishes.
func openSubscribers(s configs.Sink, opts brokers.Options) (consumers.SubscriberFactory, error) {
	return openBroker(s, func(c brokers.Config) (consumers.SubscriberFactory, error) { return brokers.Subscribers(c, opts) })
}
