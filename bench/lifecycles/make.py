#!/usr/bin/env python3
"""bench/lifecycles/make.py - writes order_fx1.json and order_fx3.json: the
built-in order lifecycle (lifecycles/order.json) with one and with three
statements of its own per event, wherever the event takes effect (applied,
and compensating after Cancelled), so that bench/run measures what a
user's statements cost the same pool on the same backlog.  Run it again
when order.json changes; the files are committed so a run needs nothing
but them.  Their tables are bench_fx.sql's."""
import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = os.path.join(HERE, '..', '..', 'lifecycles', 'order.json')

ONE = ["INSERT INTO bench_fx_log (message_id, order_id, type, at) "
       "VALUES (:message_id, :order_id, :type, :applied_at)"]
THREE = ONE + [
    "INSERT INTO bench_fx_seen (message_id, occurred) VALUES (:message_id, :occurred_at)",
    "UPDATE bench_fx_counts SET n = n + 1 WHERE bucket = CRC32(:order_id) % 64",
]


def with_statements(stmts):
    with open(ORDER) as f:
        d = json.load(f)
    for ev in d['events']:
        ev['statements'] = list(stmts)
        for state, what in (ev.get('after') or {}).items():
            if isinstance(what, dict) and 'compensate' in what:
                what['statements'] = list(stmts)
    return d


for name, stmts in (('order_fx1.json', ONE), ('order_fx3.json', THREE)):
    with open(os.path.join(HERE, name), 'w') as f:
        json.dump(with_statements(stmts), f, indent=2)
        f.write('\n')
