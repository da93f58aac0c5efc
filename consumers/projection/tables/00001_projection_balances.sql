-- +goose Up
-- The balance projection's balances per account and currency, in minor
-- units, credit positive (the ledger's convention). IF NOT EXISTS: consumer
-- databases migrated before these tables moved beside their consumer got
-- them from the consumer schema's first migration, rows and all.
CREATE TABLE IF NOT EXISTS projection_balances (
    account    text           NOT NULL,
    currency   text           NOT NULL,
    balance    numeric(38, 0) NOT NULL DEFAULT 0,
    revision   bigint         NOT NULL,
    updated_at timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (account, currency)
);

-- +goose Down
DROP TABLE projection_balances;
