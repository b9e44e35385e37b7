"""gradex.tensorflow joins jobs the way the core does: rank, size and local rank from every launcher gradex
knows (Slurm, MPICH / Intel MPI's PMI, torchrun-style variables), a launcher's size without a rank is an
error, and bootstrap goes through the core's authenticated store (GRADEX_JOB_SECRET, bounded lengths)."""
import json
import os
import subprocess
import sys

import tf_ranks

_HERE = os.path.dirname(os.path.abspath(__file__))


def _placement(rank, world):
    import numpy as np
    import gradex.tensorflow as gxt

    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    # The ranks really joined one job: the average of the ranks' numbers.
    mean = float(np.asarray(gxt.allreduce(np.float32(rank), name="rank")))
    out = {"rank": gxt.rank(), "size": gxt.size(), "local_rank": gxt.local_rank(),
           "local_size": gxt.local_size(), "mean": mean}
    gxt.shutdown()
    return out


def test_slurm_variables_give_rank_size_and_local_rank():
    # SLURM_LOCALID is the reverse of the rank, so the local rank is seen to come from it; this node's
    # entry of SLURM_TASKS_PER_NODE (SLURM_NODEID 1 of "3,2(x2)") gives the local size.
    def env(rank):
        return {"SLURM_LOCALID": 1 - rank, "SLURM_TASKS_PER_NODE": "3,2(x2)", "SLURM_NODEID": 1,
                "SLURM_JOB_ID": "4242"}
    out = tf_ranks.run("test_tf_launch:_placement", 2, env=env, launcher="slurm", timeout=180)
    for rank in range(2):
        assert out[rank] == {"rank": rank, "size": 2, "local_rank": 1 - rank, "local_size": 2, "mean": 0.5}


def test_pmi_variables_give_rank_size_and_local_rank():
    def env(rank):
        return {"MPI_LOCALRANKID": 1 - rank, "MPI_LOCALNRANKS": 2}
    out = tf_ranks.run("test_tf_launch:_placement", 2, env=env, launcher="pmi", timeout=180)
    for rank in range(2):
        assert out[rank] == {"rank": rank, "size": 2, "local_rank": 1 - rank, "local_size": 2, "mean": 0.5}


def test_local_size_the_launcher_does_not_give_is_counted_by_host():
    # RANK/WORLD_SIZE/LOCAL_RANK without LOCAL_WORLD_SIZE: both ranks run on this host.
    out = tf_ranks.run("test_tf_launch:_placement", 2, timeout=180)
    assert [o["local_size"] for o in out] == [2, 2]
    assert [o["local_rank"] for o in out] == [0, 1]


def _init_errors(envs):
    """The outcome of gxt.init() for each launcher environment in `envs`, in one fresh interpreter (importing
    TensorFlow is most of a case's cost): each case replaces the previous case's variables."""
    code = ("import json, os, sys\n"
            "import gradex.tensorflow as gxt\n"
            "for env in json.loads(sys.argv[1]):\n"
            "    os.environ.update(env)\n"
            "    try:\n        gxt.init()\n"
            "    except Exception as e:\n        print(type(e).__name__ + ': ' + str(e).replace('\\n', ' '))\n"
            "    else:\n        print('initialized', gxt.rank(), gxt.size())\n        gxt.shutdown()\n"
            "    for k in env:\n        del os.environ[k]\n")
    child = {k: v for k, v in os.environ.items() if k not in tf_ranks._LAUNCH_VARIABLES}  # noqa: SLF001
    child.update(TF_CPP_MIN_LOG_LEVEL="3", GRADEX_TIMEOUT_S="5")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(envs)], env=child, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= len(envs), done.stdout + done.stderr
    return lines[-len(envs):]


_SIZE_WITHOUT_RANK = [
    ({"PMI_SIZE": "2"}, "PMI_SIZE=2 is set but PMI_RANK is not"),
    ({"WORLD_SIZE": "4", "MASTER_PORT": "1"}, "WORLD_SIZE=4 is set but RANK is not"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE=2 is set but OMPI_COMM_WORLD_RANK is not"),
]


def test_a_size_without_a_rank_raises():
    lines = _init_errors([env for env, _ in _SIZE_WITHOUT_RANK])
    for (env, named), line in zip(_SIZE_WITHOUT_RANK, lines):
        assert line.startswith("ConfigError: "), (env, line)
        assert named in line, (env, line)


def _secret_job(rank, world, probe):
    """Both ranks join with GRADEX_JOB_SECRET; rank 1 (probe) first talks to rank 0's store as an
    attacker would: without the secret, and with an oversized length."""
    import socket
    import struct

    import numpy as np
    import gradex
    import gradex.tensorflow as gxt
    from gradex.tensorflow import _runtime

    result = {}
    try:
        gxt.init({"GRADEX_TIMEOUT_S": "20"})
    except gradex.GradexError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    if probe and rank == 1:
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))

        def frame(kind, payload):
            return struct.pack("<IHHI", 0x54535847, 1, kind, len(payload)) + payload

        def reply(sock):
            try:
                data = sock.recv(12)
            except OSError:
                return "closed"
            if len(data) < 12:
                return "closed"
            _, _, kind, length = struct.unpack("<IHHI", data)
            while length > 0:  # the reply's text, so the next reply starts at a header
                chunk = sock.recv(min(length, 1 << 16))
                if not chunk:
                    break
                length -= len(chunk)
            return kind

        key = b"gradex/tf/0/intruder"
        # A set with no hello at all, then a hello without the secret's nonce followed by a set.
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(frame(2, struct.pack("<I", len(key)) + key + struct.pack("<I", 1) + b"x"))
            result["set_without_hello"] = reply(sock)
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(frame(1, b""))
            result["hello_without_secret"] = reply(sock)
            try:
                sock.sendall(frame(2, struct.pack("<I", len(key)) + key + struct.pack("<I", 1) + b"x"))
                result["set_after_refusal"] = reply(sock)
            except OSError:
                result["set_after_refusal"] = "closed"
        # A header announcing 4 GiB - 1 of payload: refused before anything is allocated.
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(struct.pack("<IHHI", 0x54535847, 1, 1, 0xFFFFFFFF))
            result["oversized"] = reply(sock)
    # The job goes on: an exact average through the engines bootstrapped from that store.
    result["mean"] = float(np.asarray(gxt.allreduce(np.float32(rank + 1), name="after")))
    if rank == 0:
        try:
            _runtime.state().store.get("gradex/tf/0/intruder", 100)
            result["intruder_key"] = "present"
        except gradex.GradexError:
            result["intruder_key"] = "absent"
    gxt.shutdown()
    return result


def test_store_with_the_secret_refuses_intruders_and_oversized_lengths():
    out = tf_ranks.run("test_tf_launch:_secret_job", 2, env={"GRADEX_JOB_SECRET": "tf-secret"}, args=(True,),
                       timeout=180)
    assert out[0]["mean"] == out[1]["mean"] == 1.5, out
    assert out[0]["intruder_key"] == "absent", out
    probe = out[1]
    refused = ("closed", 102)  # the connection dropped, or kError
    assert probe["set_without_hello"] in refused, probe
    assert probe["hello_without_secret"] in refused, probe
    assert probe["set_after_refusal"] in refused, probe
    assert probe["oversized"] in refused, probe


def test_a_rank_with_a_wrong_secret_fails_clearly():
    def env(rank):
        return {"GRADEX_JOB_SECRET": "tf-secret" if rank == 0 else "another-secret"}
    out = tf_ranks.run("test_tf_launch:_secret_job", 2, env=env, args=(False,), timeout=180)
    assert out[1]["error"] == "ConfigError", out
    assert "job secret" in out[1]["message"], out
    # Rank 0 served the store but its peer never joined: a bounded, named failure, not a hang.
    assert out[0].get("error") in ("TimeoutError", "ConfigError", "PeerError"), out
