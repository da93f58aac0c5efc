-- +goose Up
-- The release generation moves with the delete of a park, not before it.
--
-- A relay's low-water marks may pass a parked aggregate's rows (the read
-- skips them), so deleting a park (a release, a dead-letter) moves the
-- release generation, and the first read that sees it move drops every
-- mark. The generation was a sequence, and nextval is seen by every
-- session at once, before the deleting transaction commits: a read in
-- that window saw the new generation but still the park, skipped the
-- aggregate's rows and raised its marks past them under the generation
-- that was to announce their release. Once the delete committed, nothing
-- moved again, and those rows were never read. A row updated by the
-- deleting transaction is seen together with the delete or not at all.
-- Releases are rare; the one row serializes them.
CREATE TABLE relay_release (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    generation bigint  NOT NULL
);
INSERT INTO relay_release (generation)
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM relay_release_seq;

-- SECURITY DEFINER: the roles that delete a park (posthorn_relay,
-- posthorn.dead_letter's owner) move the generation through the trigger
-- only; none may set it to a value of its choosing.
-- +goose StatementBegin
CREATE FUNCTION posthorn.relay_parked_released() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE public.relay_release SET generation = generation + 1;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER relay_parked_released ON relay_parked;
DROP FUNCTION relay_parked_released();
DROP SEQUENCE relay_release_seq;
CREATE TRIGGER relay_parked_released AFTER DELETE ON relay_parked
    FOR EACH STATEMENT EXECUTE FUNCTION posthorn.relay_parked_released();

-- +goose Down
CREATE SEQUENCE relay_release_seq;
SELECT setval('relay_release_seq', generation) FROM relay_release WHERE generation > 0;

-- +goose StatementBegin
CREATE FUNCTION relay_parked_released() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
    AS $$ BEGIN PERFORM pg_catalog.nextval('public.relay_release_seq'::regclass); RETURN NULL; END $$;
-- +goose StatementEnd

DROP TRIGGER relay_parked_released ON relay_parked;
DROP FUNCTION posthorn.relay_parked_released();
DROP TABLE relay_release;
CREATE TRIGGER relay_parked_released AFTER DELETE ON relay_parked
    FOR EACH STATEMENT EXECUTE FUNCTION relay_parked_released();
