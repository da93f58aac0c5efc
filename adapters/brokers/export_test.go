package brokers

import "github.com/ThreeDotsLabs/watermill/message"

// EmbeddedNATSSubscriber is the watermill-nats subscriber inside a NATS
// subscriber of Subscribers, for the negative control of its
// SubscribeInitialize.
func EmbeddedNATSSubscriber(sub message.Subscriber) message.SubscribeInitializer {
	return sub.(*natsEnsuring).Subscriber
}
