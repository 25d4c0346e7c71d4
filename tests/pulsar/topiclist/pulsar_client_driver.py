"""The official pulsar-client, driven over stdin/stdout for a test whose own
interpreter cannot import it (pulsar-client 3.13.0 has wheels for
cp310-cp314 only and no sdist, so 3.15 gets none): the broker and proxy under
test run in the test's interpreter, the client in this one.

One JSON command per input line, one JSON answer ({"ok": true} or
{"ok": false, "error": ...}) per output line; the ops mirror the in-process
client of kit.py (_InProcessClient)."""

import json
import re
import sys

import _pulsar
import pulsar


def main() -> None:
    client = None
    consumers = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "client":
                client = pulsar.Client(cmd["url"], operation_timeout_seconds=15,
                                       logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            elif op == "subscribe":
                consumers[cmd["id"]] = client.subscribe(re.compile(cmd["pattern"]), cmd["sub"])
            elif op == "subscribe_pattern":
                conf = _pulsar.ConsumerConfiguration()
                conf.pattern_auto_discovery_period(cmd["period"])
                consumers[cmd["id"]] = client._client.subscribe_pattern(cmd["pattern"],
                                                                        cmd["sub"], conf)
            elif op == "close":
                consumers.pop(cmd["id"]).close()
            elif op == "close_client":
                client.close()
            else:
                raise ValueError(f"unknown op {op!r}")
            answer = {"ok": True}
        except Exception as exc:  # reported to the test, which fails on it
            answer = {"ok": False, "error": repr(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
