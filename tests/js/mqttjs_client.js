// MQTT.js driven line by line by the tests (tests/test_websocket_clients.py).
//
// One JSON command per line on stdin, one JSON event per line on stdout:
//   {"op": "connect", "url": "ws://127.0.0.1:PORT/mqtt", "options": {...}, "ca": "ca.crt"}
//       -> {"event": "connect", "sessionPresent": false} or {"event": "error", "message": ...}
//   {"op": "subscribe", "topic": "t", "qos": 1}  -> {"event": "suback", "granted": [1]}
//   {"op": "publish", "topic": "t", "payload_hex": "6869", "qos": 1, "retain": false,
//    "properties": {...}}  (MQTT 5.0, MQTT.js names; correlationData in hex)
//       -> {"event": "published"} (QoS 1/2: once acknowledged)
//   {"op": "end"}   -> DISCONNECT, then {"event": "end"} and exit 0
// and, whenever one arrives: {"event": "message", "topic", "payload_hex", "qos", "retain",
// "properties"} (5.0: MQTT.js names, binary values in hex; else null);
// {"event": "close"} when the connection closes. Options go to mqtt.connect as they are
// ("will" payloads as text); reconnecting is off so that a refusal shows as it is.
'use strict';

const fs = require('fs');
const readline = require('readline');
const mqtt = require('mqtt');

let client = null;

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function fail(op, err) {
  emit({ event: 'error', op, message: String((err && err.message) || err) });
}

// MQTT 5.0 properties as JSON: binary values (Buffers) as hex strings.
function plain(props) {
  if (!props) return null;
  const out = {};
  for (const [k, v] of Object.entries(props)) {
    out[k] = Buffer.isBuffer(v) ? v.toString('hex') : v;
  }
  return out;
}

function connect(cmd) {
  const options = Object.assign({ reconnectPeriod: 0, connectTimeout: 10000 }, cmd.options || {});
  if (cmd.ca) {
    options.ca = fs.readFileSync(cmd.ca);
  }
  client = mqtt.connect(cmd.url, options);
  client.on('connect', (connack) => emit({ event: 'connect', sessionPresent: connack.sessionPresent }));
  client.on('error', (err) => fail('connect', err));
  client.on('close', () => emit({ event: 'close' }));
  client.on('message', (topic, payload, packet) => emit({
    event: 'message', topic, payload_hex: payload.toString('hex'), qos: packet.qos,
    retain: packet.retain, properties: plain(packet.properties),
  }));
}

const handlers = {
  connect,
  subscribe(cmd) {
    client.subscribe(cmd.topic, { qos: cmd.qos || 0 }, (err, granted) => {
      if (err) return fail('subscribe', err);
      emit({ event: 'suback', granted: granted.map((g) => g.qos) });
    });
  },
  publish(cmd) {
    const payload = Buffer.from(cmd.payload_hex || '', 'hex');
    const opts = { qos: cmd.qos || 0, retain: !!cmd.retain };
    if (cmd.properties) {
      opts.properties = Object.assign({}, cmd.properties);
      if (opts.properties.correlationData) {
        opts.properties.correlationData = Buffer.from(opts.properties.correlationData, 'hex');
      }
    }
    client.publish(cmd.topic, payload, opts, (err) => {
      if (err) return fail('publish', err);
      emit({ event: 'published' });
    });
  },
  end() {
    client.end(false, {}, () => {
      emit({ event: 'end' });
      process.exit(0);
    });
  },
};

const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (line) => {
  if (!line.trim()) return;
  const cmd = JSON.parse(line);
  const handler = handlers[cmd.op];
  if (!handler) return fail(cmd.op, `unknown op ${cmd.op}`);
  try {
    handler(cmd);
  } catch (err) {
    fail(cmd.op, err);
  }
});
lines.on('close', () => process.exit(0));
