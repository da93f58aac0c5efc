package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// queryRows runs sql on q and collects every row with fn: pgx.CollectRows
// with the query in front, so a read is one call and one error to wrap.
func queryRows[T any](ctx context.Context, q querier, fn pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, fn)
}

// byKey maps each of list by its key (a later duplicate key wins).
func byKey[T any](list []T, key func(T) string) map[string]T {
	m := make(map[string]T, len(list))
	for _, v := range list {
		m[key(v)] = v
	}
	return m
}
