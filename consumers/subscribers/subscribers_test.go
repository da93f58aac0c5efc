package subscribers_test

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/subscribers"
)

func TestFactoryBySinkKind(t *testing.T) {
	if _, err := subscribers.New(configs.Sink{Kind: "carrier-pigeon"}, subscribers.Options{}); !errors.Is(err, subscribers.ErrUnknownKind) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := subscribers.New(configs.Sink{Kind: "memory"}, subscribers.Options{}); err == nil {
		t.Fatal("memory without an in-process subscriber must be refused")
	}
	ch := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer ch.Close()
	f, err := subscribers.New(configs.Sink{Kind: "memory"}, subscribers.Options{Memory: ch})
	if err != nil {
		t.Fatal(err)
	}
	if sub, err := f("balance-projection"); err != nil || sub != ch {
		t.Fatalf("memory subscriber %v, %v", sub, err)
	}
	f, err = subscribers.New(configs.Sink{Kind: "kafka", Kafka: configs.KafkaSink{Brokers: []string{"127.0.0.1:1"}}}, subscribers.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f("audit-log")
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()
	// Late-joining groups must start at the oldest record (field-notes.md).
	if got := subscribers.KafkaSaramaConfig().Consumer.Offsets.Initial; got != sarama.OffsetOldest {
		t.Fatalf("initial offset %d, want OffsetOldest", got)
	}
}
