#!/usr/bin/env python3
"""Invoices: a service outside Go that publishes through Posthorn's SQL
function and consumes through its SQL inbox.

  invoices.py migrate --db URL --consumer-db URL
  invoices.py publish --db URL --count N [--customers K]
  invoices.py consume --consumer-db URL --broker HOST:PORT

publish issues N invoices across K customers. Each invoice row and its
invoice.issued event (posthorn_publish) commit in one transaction, so an
event exists exactly when its invoice does; Posthorn's relay takes the
event to Kafka (topic events.customer, keyed by the customer).

consume reads the topic from its start with kcat and, per record, calls
posthorn_inbox_receive in the same transaction as its effect (a line in
customer_invoices): 'apply' writes the line, 'duplicate' (a relay resend, or
a record read again on the next pass) writes nothing, 'revision_conflict'
(another event already took the customer's revision: recorded with both
event IDs for an operator, never applied) writes nothing, 'gap' and 'parked'
leave the record for a later pass. Reading from the start every time is
therefore safe: the inbox makes the effect exactly once. It passes over the
topic until one pass leaves nothing waiting, and prints a JSON summary.

Needs Python 3 with psycopg 3 (Debian: python3-psycopg) and kcat.
"""

import argparse
import json
import random
import subprocess
import sys

import psycopg

CONSUMER = "invoice-book"
TOPIC = "events.customer"


def migrate(args):
    with psycopg.connect(args.db, autocommit=True) as db:
        db.execute("""CREATE TABLE IF NOT EXISTS invoices (
            id bigserial PRIMARY KEY, customer text NOT NULL, amount_cents bigint NOT NULL)""")
    with psycopg.connect(args.consumer_db, autocommit=True) as db:
        db.execute("""CREATE TABLE IF NOT EXISTS customer_invoices (
            customer text NOT NULL, revision bigint NOT NULL, invoice_id bigint NOT NULL,
            amount_cents bigint NOT NULL, event_id text NOT NULL UNIQUE,
            applied_seq bigserial, PRIMARY KEY (customer, revision))""")


def publish(args):
    rng = random.Random(args.seed)
    with psycopg.connect(args.db, autocommit=True) as db:
        for _ in range(args.count):
            customer = "cust-%d" % rng.randrange(args.customers)
            amount = rng.randrange(100, 100000)
            with db.transaction():
                invoice_id = db.execute(
                    "INSERT INTO invoices (customer, amount_cents) VALUES (%s, %s) RETURNING id",
                    (customer, amount)).fetchone()[0]
                payload = {"invoice_id": invoice_id, "customer": customer, "amount_cents": amount}
                db.execute("SELECT event_id, revision FROM posthorn_publish('customer', %s, 'invoice.issued', %s::jsonb)",
                           (customer, json.dumps(payload))).fetchone()


def records(broker):
    """Every record of the topic from its start, as (headers, payload)."""
    out = subprocess.run(["kcat", "-C", "-b", broker, "-t", TOPIC, "-o", "beginning", "-e", "-q", "-J"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        r = json.loads(line)
        h = r.get("headers") or []
        yield dict(zip(h[0::2], h[1::2])), r["payload"]


def consume(args):
    summary = {"apply": 0, "duplicate": 0, "revision_conflict": 0, "gap": 0, "parked": 0, "passes": 0}
    with psycopg.connect(args.consumer_db, autocommit=True) as db:
        while True:
            summary["passes"] += 1
            waiting = 0
            for headers, payload in records(args.broker):
                with db.transaction():
                    disposition, _waits_for = db.execute(
                        "SELECT disposition, waits_for FROM posthorn_inbox_receive(%s, %s::jsonb)",
                        (CONSUMER, json.dumps(headers))).fetchone()
                    summary[disposition] += 1
                    if disposition == "apply":
                        p = json.loads(payload)
                        db.execute("""INSERT INTO customer_invoices (customer, revision, invoice_id, amount_cents, event_id)
                                      VALUES (%s, %s, %s, %s, %s)""",
                                   (headers["aggregate_id"], int(headers["revision"]), p["invoice_id"],
                                    p["amount_cents"], headers["event_id"]))
                    elif disposition in ("gap", "parked"):
                        waiting += 1
                        raise psycopg.Rollback()
            if waiting == 0 or summary["passes"] >= args.max_passes:
                break
    json.dump(summary, sys.stdout)
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("migrate")
    m.add_argument("--db", required=True)
    m.add_argument("--consumer-db", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--db", required=True)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--customers", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("consume")
    c.add_argument("--consumer-db", required=True)
    c.add_argument("--broker", required=True)
    c.add_argument("--max-passes", type=int, default=10)
    args = ap.parse_args()
    {"migrate": migrate, "publish": publish, "consume": consume}[args.cmd](args)


if __name__ == "__main__":
    main()
