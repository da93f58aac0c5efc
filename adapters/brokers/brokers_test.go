package brokers_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/kafka"
)

func TestFactoryBySinkKind(t *testing.T) {
	if _, err := brokers.Subscribers(brokers.Config{Kind: "carrier-pigeon"}, brokers.Options{}); !errors.Is(err, brokers.ErrUnknownKind) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := brokers.Subscribers(brokers.Config{Kind: "memory"}, brokers.Options{}); err == nil {
		t.Fatal("memory without an in-process subscriber must be refused")
	}
	ch := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer ch.Close()
	f, err := brokers.Subscribers(brokers.Config{Kind: "memory"}, brokers.Options{Memory: ch})
	if err != nil {
		t.Fatal(err)
	}
	if sub, err := f("balance-projection"); err != nil || sub != ch {
		t.Fatalf("memory subscriber %v, %v", sub, err)
	}
	f, err = brokers.Subscribers(brokers.Config{Kind: "kafka", Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}}, brokers.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f("audit-log")
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()
}
