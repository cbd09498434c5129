// ce_producer.mjs - a producer that is not ours: events built by the
// official CloudEvents SDK for JavaScript (npm "cloudevents") and published
// with amqplib, in structured and in binary mode, for
// tests/integration/test_envelopes.c (envelopes/the_cloudevents_sdk_for_javascript_as_producer).
//
//   node ce_producer.mjs AMQP_URL EXCHANGE ORDER_ID
//
// The SDK has no AMQP binding; its HTTP binding gives the structured body
// and content type, and the binary headers ce-<attribute>, which the
// CloudEvents AMQP binding names cloudEvents:<attribute>.  Publishes, with
// publisher confirms:
//   1. OrderCreated, structured mode;
//   2. PaymentAuthorized, binary mode, with a W3C traceparent extension;
//   3. the same PaymentAuthorized event again in structured mode (a
//      duplicate: the same source + id, the same event);
//   4. OrderCancelled, binary mode with cloudEvents_ headers (what clients
//      that refuse ':' in header names send).
import { CloudEvent, HTTP } from "cloudevents";
import amqp from "amqplib";

const [url, exchange, order] = process.argv.slice(2);
if (!url || !exchange || !order) {
  console.error("usage: node ce_producer.mjs AMQP_URL EXCHANGE ORDER_ID");
  process.exit(2);
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const created = new CloudEvent({
  id: `${order}-created`, source: "https://sales.example.com/v1", type: "com.example.order.created",
  subject: order, datacontenttype: "application/json", data: { channel: "web" },
});
const paid = new CloudEvent({
  id: `${order}-paid`, source: "https://payments.example.com/v1", type: "com.example.payment.authorized",
  subject: order, datacontenttype: "application/json", data: { amount_cents: 4200 }, traceparent,
});
const cancelled = new CloudEvent({
  id: `${order}-cancelled`, source: "https://sales.example.com/v1", type: "com.example.order.cancelled",
  subject: order, datacontenttype: "application/json", data: {},
});

function structured(ev) {
  const m = HTTP.structured(ev);
  return { body: m.body, options: { contentType: m.headers["content-type"], persistent: true } };
}

function binary(ev, prefix) {
  const m = HTTP.binary(ev);
  const headers = {};
  let contentType;
  for (const [k, v] of Object.entries(m.headers)) {
    if (k === "content-type") contentType = v;
    else if (k.startsWith("ce-")) headers[prefix + k.slice(3)] = String(v);
  }
  const body = typeof m.body === "string" ? m.body : JSON.stringify(m.body);
  return { body, options: { contentType, headers, persistent: true } };
}

const conn = await amqp.connect(url);
try {
  const ch = await conn.createConfirmChannel();
  const send = (type, m) => ch.publish(exchange, `order.${type}`, Buffer.from(m.body), m.options);
  send("OrderCreated", structured(created));
  send("PaymentAuthorized", binary(paid, "cloudEvents:"));
  send("PaymentAuthorized", structured(paid));
  send("OrderCancelled", binary(cancelled, "cloudEvents_"));
  await ch.waitForConfirms();
  await ch.close();
} finally {
  await conn.close();
}
console.log("published 4 CloudEvents for", order);
