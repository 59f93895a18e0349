#!/usr/bin/env python3
"""Publish to and consume from shardq serve with Python's standard library.

    SHARDQ_URL=http://127.0.0.1:8080 SHARDQ_TENANT=acme SHARDQ_TOKEN=sq_... python3 shardq_example.py

The token needs the admin role of tenant SHARDQ_TENANT (default "demo"),
or the publish and consume roles together. It publishes three
messages of one order (one message group), receives them in order, prints
each, and acknowledges them.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("SHARDQ_URL", "http://127.0.0.1:8080")
TOKEN = os.environ["SHARDQ_TOKEN"]
TENANT = os.environ.get("SHARDQ_TENANT", "demo")


def call(path, body):
    """POSTs body as JSON and returns the decoded answer; a problem+json
    error becomes an exception that says what the server said."""
    req = urllib.request.Request(
        BASE + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        problem = json.load(e)
        raise RuntimeError(f"{e.code} {problem.get('title')}: {problem.get('detail')}") from None


def topic(tenant, name):
    return f"/v1/tenants/{urllib.parse.quote(tenant, safe='')}/topics/{urllib.parse.quote(name, safe='')}"


def main():
    orders = topic(TENANT, "orders")
    # Publish: idempotent by id, so a retry after a timeout is safe.
    published = call(orders + "/messages", {"messages": [
        {"key": "order-42", "id": "order-42-created", "payload": json.dumps({"state": "created"})},
        {"key": "order-42", "id": "order-42-paid", "payload": json.dumps({"state": "paid"})},
        {"key": "order-42", "id": "order-42-shipped", "payload": json.dumps({"state": "shipped"}),
         "headers": {"carrier": "dhl"}},
    ]})
    for r in published["results"]:
        print(f"published {r['id']} at offset {r['offset']}{' (duplicate)' if r['duplicate'] else ''}")

    # Receive as consumer group "python-readers": the next free message
    # group, in order; long-poll up to 1 s. Ack what was handled.
    group = orders + "/groups/python-readers"
    handled = 0
    while True:
        got = call(group + "/receive", {"next_group": True, "max": 10, "wait": 1})["messages"]
        if not got:
            break
        for m in got:
            print(f"received {m['key']} {m['id']} attempt {m['attempt']}: {m['payload']}")
        call(group + "/ack", {"receipts": [m["receipt"] for m in got]})
        handled += len(got)
    print(f"acknowledged {handled} messages")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        print(f"shardq: {e}", file=sys.stderr)
        sys.exit(1)
