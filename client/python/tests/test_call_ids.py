"""Each call's posenc-call-id is its own, also across a fork: a model
server's workers forked after importing posenc must not send their parent's
(or each other's) ids, which the server would refuse as retries of calls it
already started in place. No server needed."""

import os

from posenc import client as posenc_client


def call_id():
    (value,) = [v for k, v in posenc_client._metadata("") if k == "posenc-call-id"]
    return value


def test_ids_differ_call_to_call_and_keep_the_request_id():
    ids = {call_id() for _ in range(1000)}
    assert len(ids) == 1000
    md = dict(posenc_client._metadata("req-7"))
    assert md["x-request-id"] == "req-7" and md["posenc-call-id"]


def test_forked_children_make_ids_of_their_own():
    parent = [call_id() for _ in range(3)]
    children = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next ids, to the parent
            os.close(read)
            os.write(write, ("\n".join(call_id() for _ in range(3))).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            children.append(f.read().split("\n"))
        os.waitpid(pid, 0)
    after = [call_id() for _ in range(3)]
    seen = parent + after + children[0] + children[1]
    assert len(set(seen)) == len(seen), seen
