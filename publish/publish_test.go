package publish

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/core"
)

// recorder is a transaction that records the call to posthorn.write and
// answers with answer (nil: one row). The database's side, the function
// itself, is proven in integration/publish_test.go against PostgreSQL;
// this is the library's own part: what it sends and how it reads refusals.
type recorder struct {
	args   []any
	answer error
}

func (r *recorder) QueryRowContext(_ context.Context, _ string, args ...any) row {
	r.args = args
	return fakeRow{r.answer}
}

type fakeRow struct{ err error }

func (f fakeRow) Scan(dest ...any) error {
	if f.err != nil {
		return f.err
	}
	*dest[0].(*string), *dest[1].(*int64), *dest[2].(*string) = "e-1", 1, "events.wallet"
	return nil
}

func TestPublishSendsTheMessageAsWritten(t *testing.T) {
	rec := &recorder{}
	p := &Publisher{q: rec}
	prefix := "commands."
	_, err := p.WithCommandTopicPrefix(prefix).Command(context.Background(), Message{AggregateType: "wallet", AggregateID: "w-1",
		Type: "payouts.payout.execute", Payload: []byte(`{"a":1}`), Headers: map[string]string{"trace": "t"}, SchemaVersion: 2, Revision: 7})
	if err != nil {
		t.Fatal(err)
	}
	var headers map[string]string
	if err := json.Unmarshal([]byte(rec.args[5].(string)), &headers); err != nil {
		t.Fatal(err)
	}
	if rec.args[0] != string(core.KindCommand) || rec.args[1] != "wallet" || rec.args[2] != "w-1" || rec.args[4] != `{"a":1}` ||
		headers["trace"] != "t" || headers[core.HeaderSchemaVersion] != "2" || *rec.args[6].(*int64) != 7 || *rec.args[7].(*string) != prefix {
		t.Fatalf("posthorn.write called with %v, headers %v", rec.args, headers)
	}
	// Without a revision or a prefix, the database chooses: NULL for both.
	if _, err := p.Event(context.Background(), Message{AggregateType: "wallet", AggregateID: "w-1", Type: "wallet.credited", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if rec.args[0] != string(core.KindEvent) || rec.args[6].(*int64) != nil || rec.args[7].(*string) != nil {
		t.Fatalf("an event without revision or prefix: %v", rec.args)
	}
}

func TestPublishRefusesBeforeTheDatabase(t *testing.T) {
	for _, tc := range []struct {
		m     Message
		field string
	}{
		{Message{Payload: []byte("{not json")}, "payload"},
		{Message{Payload: []byte(`{}`), SchemaVersion: -1}, "schema_version"},
	} {
		rec := &recorder{}
		_, err := (&Publisher{q: rec}).Event(context.Background(), tc.m)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || rec.args != nil {
			t.Fatalf("%+v: %v (database called: %v), want a FieldError for %s before any call", tc.m, err, rec.args != nil, tc.field)
		}
	}
}

func TestPublishReadsTheDatabasesRefusals(t *testing.T) {
	for _, tc := range []struct {
		answer error
		check  func(error) bool
	}{
		{&pgconn.PgError{Code: "22023", Message: "aggregate_id: is empty"}, func(err error) bool {
			var fe *FieldError
			return errors.As(err, &fe) && fe.Field == "aggregate_id" && fe.Reason == "is empty"
		}},
		{&pgconn.PgError{Code: "PH001", Message: "revision: want 3"}, func(err error) bool {
			return errors.Is(err, ErrRevision) && err.Error() == "publish: revision is not the next: want 3"
		}},
		{errors.New("connection reset"), func(err error) bool {
			var fe *FieldError
			return !errors.As(err, &fe) && !errors.Is(err, ErrRevision) && err.Error() == "publish: connection reset"
		}},
	} {
		_, err := (&Publisher{q: &recorder{answer: tc.answer}}).Event(context.Background(), Message{Payload: []byte(`{}`)})
		if !tc.check(err) {
			t.Fatalf("the database answered %v; the library returned %v", tc.answer, err)
		}
	}
}
