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
// A connect command with "scram": {"user", "password"} (and protocolVersion 5) logs in by
// SCRAM-SHA-256 through MQTT.js's handleAuth; its connect event says "scramVerified": whether
// the CONNACK's server-final-message proves the server holds the user's keys.
'use strict';

const crypto = require('crypto');
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

// The client's side of SCRAM-SHA-256 (RFC 5802, RFC 7677), with Node's crypto alone.
function scramClient(user, password) {
  const nonce = crypto.randomBytes(18).toString('base64');
  const bare = `n=${user.replace(/=/g, '=3D').replace(/,/g, '=2C')},r=${nonce}`;
  const hmac = (key, msg) => crypto.createHmac('sha256', key).update(msg).digest();
  const scram = { first: Buffer.from(`n,,${bare}`), expected: null };
  scram.final = (serverFirst) => {
    const text = serverFirst.toString();
    const attrs = Object.fromEntries(text.split(',').map((part) => [part[0], part.slice(2)]));
    if (!attrs.r.startsWith(nonce)) throw new Error('the server nonce does not extend ours');
    const salted = crypto.pbkdf2Sync(password, Buffer.from(attrs.s, 'base64'),
      parseInt(attrs.i, 10), 32, 'sha256');
    const clientKey = hmac(salted, 'Client Key');
    const withoutProof = `c=biws,r=${attrs.r}`;
    const authMessage = `${bare},${text},${withoutProof}`;
    const signature = hmac(crypto.createHash('sha256').update(clientKey).digest(), authMessage);
    const proof = Buffer.from(clientKey.map((b, i) => b ^ signature[i]));
    scram.expected = `v=${hmac(hmac(salted, 'Server Key'), authMessage).toString('base64')}`;
    return Buffer.from(`${withoutProof},p=${proof.toString('base64')}`);
  };
  return scram;
}

function connect(cmd) {
  const options = Object.assign({ reconnectPeriod: 0, connectTimeout: 10000 }, cmd.options || {});
  if (cmd.ca) {
    options.ca = fs.readFileSync(cmd.ca);
  }
  const scram = cmd.scram ? scramClient(cmd.scram.user, cmd.scram.password) : null;
  if (scram) {
    options.properties = Object.assign({}, options.properties, {
      authenticationMethod: 'SCRAM-SHA-256', authenticationData: scram.first });
  }
  client = mqtt.connect(cmd.url, options);
  if (scram) {
    client.handleAuth = (packet, callback) => {
      try {
        callback(null, { cmd: 'auth', reasonCode: 0x18, properties: {
          authenticationMethod: 'SCRAM-SHA-256',
          authenticationData: scram.final(packet.properties.authenticationData) } });
      } catch (err) {
        callback(err);
      }
    };
  }
  client.on('connect', (connack) => {
    const data = connack.properties && connack.properties.authenticationData;
    emit({ event: 'connect', sessionPresent: connack.sessionPresent,
      scramVerified: scram ? !!data && data.toString() === scram.expected : null });
  });
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
