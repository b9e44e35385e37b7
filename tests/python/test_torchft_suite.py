"""torchft's own integration tests (from the installed package) with ProcessGroupGradex in place of
ProcessGroupGloo: the Manager with fault-tolerant DDP (healthy, a replica failing and recovering live from a
peer, several ranks per replica group), LocalSGD and DiLoCo with recovery, and the checkpoint transport over a
process group. Each test is run by unittest inside this process, as torchft runs it; the replica groups are
threads, a failure is an exception that restarts a replica, and the test's own assertions (every replica ends
with the same state dict) decide. docs/elastic.md lists the tests that do not apply and why.

Skipped when torchft or `parameterized` is absent.
"""
import pytest

pytest.importorskip("torchft")
pytest.importorskip("parameterized")

import torchft_suite  # noqa: E402

_DILOCO_HELPERS = ("torchft._test.diloco_trainer",)

CASES = [
    ("torchft.manager_integ_test", "ManagerIntegTest.test_ddp_healthy", ()),
    ("torchft.manager_integ_test", "ManagerIntegTest.test_ddp_recovery_0_async_quorum", ()),
    ("torchft.manager_integ_test", "ManagerIntegTest.test_ddp_recovery_1_sync_quorum", ()),
    ("torchft.manager_integ_test", "ManagerIntegTest.test_ddp_skip_init_sync", ()),
    ("torchft.manager_integ_test", "ManagerIntegTest.test_ddp_recovery_multi_rank", ()),
    ("torchft.manager_integ_test", "ManagerIntegTest.test_manager_allreduce_1", ()),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_local_sgd_recovery_0", ()),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_diloco_healthy_0", _DILOCO_HELPERS),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_diloco_recovery_0", _DILOCO_HELPERS),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_streaming_diloco_recovery_0", _DILOCO_HELPERS),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_streaming_diloco_upscale_00", _DILOCO_HELPERS),
    ("torchft.local_sgd_integ_test", "LocalSGDIntegTest.test_streaming_diloco_commit_failure_00", _DILOCO_HELPERS),
    ("torchft.checkpointing.pg_transport_test", "PGTransportTest.test_pg_transport_gloo", ()),
]


@pytest.mark.parametrize("module,test_id,helpers", CASES, ids=[c[1] for c in CASES])
def test_torchft_suite_on_gradex(module, test_id, helpers):
    passed, report = torchft_suite.run(module, test_id, helpers)
    assert passed, report
