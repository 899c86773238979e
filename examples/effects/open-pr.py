# /// script
# requires-python = ">=3.8"
# dependencies = []
# ///
# Opens a pull request, then tells the team, each at most once however often this script is run:
# each effect is declared in the run's effect ledger before it is made (cairn_effects, shipped with
# Cairn), and each request carries the effect's idempotency key, which the API uses to answer a
# repeated request with the first one's result.
import json
import os
import pathlib
import time

from cairn_effects import effect

# The outside system: an API that takes idempotency keys. Here a directory of the workspace stands
# for it (a cell has no network), recording each request once per key, as Stripe's or GitHub's
# would; `find` looks a request up by its key.
API = pathlib.Path("api")


def post(kind, key, body):
    API.mkdir(exist_ok=True)
    record = API / ("%s-%s.json" % (kind, key))
    if not record.exists():
        record.write_text(json.dumps(dict(body, id="%s-%d" % (kind, len(list(API.glob(kind + "-*")))+ 1))))
    return json.loads(record.read_text())


def find(kind, key):
    record = API / ("%s-%s.json" % (kind, key))
    return json.loads(record.read_text()) if record.exists() else None


def once(name, kind, body):
    """Makes effect `name` through the API at most once, and returns its result."""
    with effect(name) as e:
        if e.status == "done":
            print("%s: done before, not repeated: %s" % (name, json.dumps(e.result)))
            return e.result
        if e.status == "uncertain":
            # Begun and never ended: only the API can tell whether it happened.
            found = find(kind, e.key)
            if found is not None:
                e.done({"id": found["id"]})
                print("%s: found done at the API: %s" % (name, found["id"]))
                return e.result
            e.retry()
        made = post(kind, e.key, body)
        e.result = {"id": made["id"]}
        print("%s: made now: %s (idempotency key %s)" % (name, made["id"], e.key))
    return e.result


pr = once("open-pr", "pr", {"title": "Fix the parser", "branch": "fix-parser"})

# The demo interrupts the worker here, once, between the two effects (kill -9).
if os.path.exists(".demo-crash-here"):
    os.remove(".demo-crash-here")
    pathlib.Path(".between-effects").touch()
    time.sleep(120)

once("notify-team", "message", {"text": "Pull request %s is ready for review" % pr["id"]})
