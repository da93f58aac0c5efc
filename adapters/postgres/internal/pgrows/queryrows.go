// Package pgrows holds the row-reading helpers the PostgreSQL adapter's
// stores share.
package pgrows

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Querier is a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Query runs sql on q and collects every row with fn: pgx.CollectRows
// with the query in front, so a read is one call and one error to wrap.
func Query[T any](ctx context.Context, q Querier, fn pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, fn)
}

// ByKey maps each of list by its key (a later duplicate key wins).
func ByKey[T any](list []T, key func(T) string) map[string]T {
	m := make(map[string]T, len(list))
	for _, v := range list {
		m[key(v)] = v
	}
	return m
}
