#!/usr/bin/env python3
"""Write the seed corpus of fuzz_envelope (fuzz/corpus/envelope/).

    fuzz/gen_envelope_corpus.py fuzz/corpus/envelope

Each seed follows fuzz_envelope.c's input layout: a mode byte (envelope,
content type, correlation id, small body limit, order id path), a header
count, the headers (name index, length, bytes), the correlation id, the
body.  Run again after changing the layout; the seeds are committed.
"""
import os
import sys

NAMES = ["cloudEvents:specversion", "cloudEvents:id", "cloudEvents:source", "cloudEvents:type",
         "cloudEvents:subject", "cloudEvents:time", "cloudEvents:traceparent", "cloudEvents:tracestate",
         "cloudEvents_specversion", "cloudEvents_id", "cloudEvents_source", "cloudEvents_type",
         "cloudEvents_subject", "traceparent", "tracestate", "x-other"]
CT = [None, "application/cloudevents+json", "application/json", "application/vnd.masstransit+json",
      "text/plain", "APPLICATION/CloudEvents+JSON; charset=utf-8", "application/cloudevents-batch+json",
      "application/x+json"]
ENV = {"native": 0, "cloudevents": 1, "masstransit": 2, "auto": 3}
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def seed(env, ct=0, headers=(), corr=None, body="", small=False, path=False):
    mode = ENV[env] | (ct << 2) | (0x20 if corr is not None else 0) | (0x40 if small else 0) | (0x80 if path else 0)
    out = bytearray([mode, len(headers)])
    for name, value, *other in headers:
        v = value.encode()
        out += bytes([NAMES.index(name) | (0x80 if other else 0), len(v)]) + v
    if corr is not None:
        c = corr.encode()
        out += bytes([len(c)]) + c
    return bytes(out) + body.encode()


CE = ('{"specversion":"1.0","id":"A234-1234-1234","source":"https://payments.example.com/v1",'
      '"type":"com.example.payment.authorized","subject":"o-1","time":"2026-11-29T18:00:00Z",'
      '"datacontenttype":"application/json","data":{"amount_cents":4200}%s}')
BIN = [("cloudEvents:specversion", "1.0"), ("cloudEvents:id", "b-1"), ("cloudEvents:source", "/payments"),
       ("cloudEvents:type", "PaymentAuthorized"), ("cloudEvents:subject", "o-1"),
       ("cloudEvents:time", "2026-11-29T18:00:00Z")]
MT = ('{"messageId":"0c6d1e2f-3a4b-4d3e-9a55-5b0d9f6e2c1a","correlationId":"c-1",'
      '"sourceAddress":"rabbitmq://broker:5672/sales/payments?temporary=true",'
      '"messageType":["urn:message:Sales.Contracts:PaymentAuthorized"],'
      '"message":{"orderId":"o-7","amount_cents":99},"sentTime":"2026-12-01T10:00:00.1234567Z"}')
NATIVE = '{"message_id":"m-1","source":"payments","type":"PaymentAuthorized","order_id":"o-1","data":{"amount_cents":5}}'

SEEDS = {
    "ce-structured": seed("cloudevents", 1, body=CE % ""),
    "ce-structured-auto": seed("auto", 5, body=CE % ""),
    "ce-structured-trace": seed("auto", 1, body=CE % (',"traceparent":"%s","tracestate":"congo=t61rcWkgMzE"' % TP)),
    "ce-structured-header-trace": seed("auto", 1, [("traceparent", TP), ("tracestate", "a=b")], body=CE % ""),
    "ce-structured-base64": seed("cloudevents", 1, body=CE % ',"data_base64":"AAAA"'),
    "ce-structured-ct-text": seed("cloudevents", 1, body=CE.replace("application/json", "text/plain") % ""),
    "ce-structured-v03": seed("cloudevents", 1, body=(CE % "").replace('"1.0"', '"0.3"')),
    "ce-structured-no-id": seed("cloudevents", 1, body=(CE % "").replace('"id":"A234-1234-1234",', "")),
    "ce-structured-id-number": seed("cloudevents", 1, body=(CE % "").replace('"A234-1234-1234"', "7")),
    "ce-structured-unknown-type": seed("cloudevents", 1, body=(CE % "").replace("payment.authorized", "x")),
    "ce-structured-batch": seed("auto", 6, body="[" + CE % "" + "]"),
    "ce-structured-truncated": seed("cloudevents", 1, body=(CE % "")[:60]),
    "ce-structured-path": seed("cloudevents", 1, path=True,
                               body='{"specversion":"1.0","id":"1","source":"urn:x","type":"OrderCreated",'
                                    '"data":{"order":{"id":"o-9"}}}'),
    "ce-structured-small": seed("cloudevents", 1, small=True, body=CE % ""),
    "ce-binary": seed("auto", 2, BIN, body='{"amount_cents":4200}'),
    "ce-binary-empty": seed("cloudevents", 0, BIN, body=""),
    "ce-binary-underscore": seed("auto", 2, [(n.replace(":", "_"), v) for n, v in BIN[:5]], body="{}"),
    "ce-binary-trace": seed("auto", 2, BIN + [("cloudEvents:traceparent", TP)], body="{}"),
    "ce-binary-other": seed("auto", 2, [("cloudEvents:specversion", "1.0"), ("cloudEvents:id", "x", True)], body="{}"),
    "ce-binary-text": seed("auto", 4, BIN, body="hello"),
    "ce-binary-no-source": seed("auto", 2, BIN[:2] + BIN[3:], body="{}"),
    "mt": seed("masstransit", 3, corr="amqp-corr", body=MT),
    "mt-auto": seed("auto", 3, body=MT),
    "mt-no-type": seed("masstransit", 3, body=MT.replace('"messageType":["urn:message:Sales.Contracts:PaymentAuthorized"],', "")),
    "mt-map": seed("masstransit", 3, body=MT.replace("Sales.Contracts:PaymentAuthorized", "A.B:Paid")),
    "mt-bad-address": seed("masstransit", 3, body=MT.replace("rabbitmq://broker:5672/sales/payments?temporary=true", "nowhere")),
    "native": seed("native", 2, body=NATIVE),
    "native-auto-trace": seed("auto", 2, [("traceparent", TP), ("tracestate", "k=v")], corr="corr-1", body=NATIVE),
    "native-bad-trace": seed("auto", 0, [("traceparent", "00-" + "0" * 32 + "-00f067aa0ba902b7-01")], body=NATIVE),
    "native-future-trace": seed("auto", 0, [("traceparent", "cc" + TP[2:] + "-what-ever")], body=NATIVE),
}

def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/envelope"
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("%d seeds in %s" % (len(SEEDS), out))

if __name__ == "__main__":
    main()
