package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
)

// Settings are the parts of the configuration the ledger database's own
// functions obey, kept in posthorn.settings so that no caller can choose
// them: the SQL publishing functions put commands on CommandTopicPrefix +
// <service> whatever the caller asks, and posthorn.prune_idempotency_keys
// never deletes a key younger than IdempotencyKeyTTL. posthorn migrate
// writes them from sink.command_topic_prefix and
// retention.idempotency_key_ttl, and MaxRecordBytes, the largest record the
// configured sink carries, from sink.kind and its keys: posthorn.write
// refuses a payload that could never be sent.
type Settings struct {
	CommandTopicPrefix string
	IdempotencyKeyTTL  time.Duration
	MaxRecordBytes     int64
}

// MinRecordBytes is the smallest MaxRecordBytes: posthorn.write keeps 4096
// bytes of a record for the envelope.
const MinRecordBytes = 4096

// ErrReservedTopicPrefix is a command topic prefix that would put commands
// on the ledger's or the events' topics.
var ErrReservedTopicPrefix = errors.New("is reserved: ledger.*, events.* and outbox.* (also with _ or - for the dot, in any case) are the ledger's and the events' topics")

var (
	topicPrefixShape    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	reservedTopicPrefix = regexp.MustCompile(`^(ledger|events|outbox)[._-]`)
)

// Validate names the configuration key of a setting the database would
// refuse.
func (s Settings) Validate() error {
	if !topicPrefixShape.MatchString(s.CommandTopicPrefix) {
		return fmt.Errorf("sink.command_topic_prefix: is %q, want 1 to 64 letters, digits, '.', '_' or '-'", s.CommandTopicPrefix)
	}
	if reservedTopicPrefix.MatchString(strings.ToLower(s.CommandTopicPrefix)) {
		return fmt.Errorf("sink.command_topic_prefix: %q %w", s.CommandTopicPrefix, ErrReservedTopicPrefix)
	}
	if s.MaxRecordBytes < MinRecordBytes {
		return fmt.Errorf("sink max_payload_bytes: the sink's record limit is %d bytes, want at least %d", s.MaxRecordBytes, MinRecordBytes)
	}
	if s.IdempotencyKeyTTL < time.Hour {
		return fmt.Errorf("retention.idempotency_key_ttl: is %s, want at least 1h", s.IdempotencyKeyTTL)
	}
	return nil
}

// WriteSettings stores s in posthorn.settings of the migrated ledger
// database at dsn (as its owner).
func WriteSettings(ctx context.Context, dsn string, s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	conn, err := connectOnce(ctx, dsn, "settings")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `UPDATE posthorn.settings SET command_topic_prefix = $1, idempotency_key_ttl = $2, max_record_bytes = $3`,
		s.CommandTopicPrefix, s.IdempotencyKeyTTL, s.MaxRecordBytes)
	if err != nil {
		return fmt.Errorf("settings: write posthorn.settings (run posthorn migrate first, as the tables' owner): %w", err)
	}
	return nil
}

// PublicSchemaCreators lists the roles other than its owner that may
// create objects in the schema public of the database q is connected to
// ("PUBLIC" standing for every role). PostgreSQL 15 grants none; 14 and
// earlier, and clusters upgraded from them, grant it to every role. Such a
// role can shadow a built-in function or operator for anyone whose
// search_path has public first; Posthorn's own definer functions no longer
// look there, but other code in the database may.
func PublicSchemaCreators(ctx context.Context, q pgrows.Querier) ([]string, error) {
	names, err := pgrows.Query(ctx, q, pgx.RowTo[string], `
SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END
FROM pg_catalog.pg_namespace AS n,
     pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) AS a
WHERE n.nspname = 'public' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("read the privileges of schema public: %w", err)
	}
	return names, nil
}
