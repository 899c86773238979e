/**
 * `cairn_effects`, the Python module a script cell imports to use the effect ledger
 * (`from cairn_effects import effect`). It is shipped inside Cairn as this text, written into the
 * harness's private runtime dir at open and bound read-only into every sandbox at
 * /run/cairn/python, which is on the cell's PYTHONPATH: a script needs no network and no package to
 * use it. It speaks the cell socket directly (standard library only), as `cairn effect` does.
 */

/** The file name, and the text, of the module. */
export const PYTHON_EFFECTS_FILE = "cairn_effects.py";

export const PYTHON_EFFECTS_SOURCE = `"""Cairn's effect ledger, for scripts that run as Cairn cells.

Declare each effect on the world outside (a pull request, a message, a payment) before making it,
so that a cell run again after a crash does not make it twice:

    from cairn_effects import effect

    with effect("open-pr") as e:
        if e.status == "proceed":      # never begun: do it, with the run-wide idempotency key
            pr = open_pull_request(idempotency_key=e.key)
            e.done({"number": pr["number"]})
        elif e.status == "done":       # done before: its recorded result
            number = e.result["number"]
        else:                           # "uncertain": begun before and never ended
            pr = find_pull_request(idempotency_key=e.key)
            if pr is not None:
                e.done({"number": pr["number"]})
            else:
                e.retry()              # it did not happen: begin it again (status is "proceed")
                ...

\`begin\` (entering the block) is committed to the run's log before it answers "proceed". Leaving
the block normally while the status is still "proceed" ends the effect with \`e.result\` (None unless
set); leaving it by an exception ends nothing: the effect stays "uncertain", for the next attempt
(or the model) to reconcile with the outside system. \`effect_key(name)\` gives the key alone.
Standard library only; talks to the harness over CAIRN_TIMER_SOCKET with CAIRN_CELL_TOKEN.
"""

import json
import os
import socket

__all__ = ["effect", "effect_key", "launch_key", "Effect", "EffectRefused"]


class EffectRefused(RuntimeError):
    """The harness refused a request (or could not be reached): nothing was recorded.

    \`code\` says why: "usage" (a bad name or result), "reset" (this worker was fenced: another owns
    the run), "uncertain" (the storage could not say whether it was recorded), "unreachable", ...
    Never treat a refused begin as "proceed".
    """

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def _ask(op, **fields):
    path = os.environ.get("CAIRN_TIMER_SOCKET")
    token = os.environ.get("CAIRN_CELL_TOKEN")
    if not path or not token:
        raise EffectRefused("not inside a Cairn cell: CAIRN_TIMER_SOCKET and CAIRN_CELL_TOKEN are not set", "usage")
    request = dict(fields)
    request["token"] = token
    request["op"] = op
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall((json.dumps(request) + "\\n").encode("utf-8"))
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as err:
        raise EffectRefused("cannot reach the harness at %s: %s" % (path, err), "unreachable") from err
    try:
        reply = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError as err:
        raise EffectRefused("the harness closed the connection without an answer", "unreachable") from err
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        error = reply.get("error") if isinstance(reply, dict) else None
        code = reply.get("code") if isinstance(reply, dict) else None
        raise EffectRefused("effect %s refused: %s" % (op, error or "no answer"), code)
    return reply


def effect_key(name):
    """The run-wide idempotency key of effect \`name\`: the same in every cell of the run and its forks."""
    return _ask("effect_key", name=name)["key"]


def launch_key():
    """This launch's own key (CAIRN_EFFECT_KEY)."""
    return os.environ.get("CAIRN_EFFECT_KEY")


class Effect:
    """One named effect of the run. \`status\` is None until \`begin()\` (or entering a with block)."""

    def __init__(self, name):
        self.name = name
        self.status = None
        self.key = None
        self.result = None
        self.known = None
        self.attempt = None

    def _take(self, reply):
        self.key = reply.get("key", self.key)
        self.status = reply["answer"]
        if self.status == "done":
            self.result = reply.get("result")
        elif self.status == "uncertain":
            self.known = reply.get("known")
        elif self.status == "proceed":
            self.attempt = reply.get("attempt")
        return self

    def begin(self):
        """Asks the ledger: "proceed" (committed before this returns), "done" or "uncertain"."""
        return self._take(_ask("effect_begin", name=self.name))

    def retry(self):
        """For an uncertain effect the outside system shows did not happen: begin it again."""
        if self.status != "uncertain":
            raise EffectRefused("retry is for an uncertain effect; %s is %s" % (self.name, self.status), "usage")
        return self._take(_ask("effect_begin", name=self.name, retry=True))

    def done(self, result=None):
        """Records that the effect happened, with a small JSON result (an id, a URL); committed before this returns."""
        reply = _ask("effect_end", name=self.name, result=result)
        self.status = "done"
        self.result = reply.get("result", result)
        return self

    def __enter__(self):
        return self.begin()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and self.status == "proceed":
            self.done(self.result)
        return False


def effect(name):
    """The effect \`name\` of this run, to use in a with block (or call \`.begin()\` yourself)."""
    return Effect(name)
`;
