"""A Hub that refuses the credentials is a credential error (exit 10), not an outage: the local
hub answers a wrong token and a gated repo as huggingface.co does (the official client reads
its answers as it reads huggingface.co's), and `k3a stage`, sending the token as that client
finds it (HF_TOKEN), names the cause and the step that fixes it."""

from __future__ import annotations

import pytest
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

from k3artifacts.errors import EXIT_CODES
from tests.staging_helpers import REPO, small_release
from tests.support.cli import invoke

GOOD, OTHER, WRONG = "hf_granted", "hf_not_granted", "hf_typo"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def gated_hub(make_local_hub, tmp_path):
    server = make_local_hub(tokens={GOOD, OTHER}, gated={REPO})
    server.hub.add_commit(REPO, small_release(tmp_path))
    server.hub.grant(REPO, GOOD)
    return server


def test_the_official_client_reads_the_local_hubs_refusals_as_huggingface_cos(gated_hub):
    fetch = {"repo_id": REPO, "filename": SHARD, "endpoint": gated_hub.endpoint,
             "cache_dir": gated_hub.cache_dir}
    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download(**fetch, token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as not_granted:
        hf_hub_download(**fetch, token=OTHER)
    assert not_granted.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as wrong:
        hf_hub_download(**fetch, token=WRONG)
    assert wrong.value.response.status_code == 401
    assert wrong.value.server_message == "Invalid credentials in Authorization header"
    assert hf_hub_download(**fetch, token=GOOD)
    # Metadata stays open to anyone, as on huggingface.co: the gate is on the files.
    assert gated_hub.api(token=False).model_info(REPO).gated == "auto"


def _stage(server, tmp_path, token: str | None, *extra: str, expect: int):
    env = {"HF_TOKEN": token} if token else {}
    return invoke("stage", REPO, "--endpoint", server.endpoint, "--store",
                  f"file://{tmp_path / 'store'}", "-q", *extra, env=env, expect=expect)


@pytest.mark.parametrize(("token", "said", "step"), [
    (WRONG, "the hub refused the token: HTTP 401 (Invalid credentials in Authorization header)",
     "HF_TOKEN (else the token `hf auth login` saved) is wrong, expired or revoked"),
    (None, "gated repository, and no token was sent: HTTP 401",
     "accept the model's terms on its page ({endpoint}/{repo}) while logged in, then set "
     "HF_TOKEN"),
    (OTHER, "gated repository: the token's account has no access: HTTP 403",
     "accept the model's terms on its page ({endpoint}/{repo}) with the account HF_TOKEN "
     "belongs to"),
], ids=["wrong-token-401", "gated-anonymous-401", "gated-not-granted-403"])
def test_stage_names_a_refused_credential_and_its_fix(gated_hub, tmp_path, token, said, step):
    ran = _stage(gated_hub, tmp_path, token, expect=10)
    assert said in ran.stderr
    assert f"next: {step.format(endpoint=gated_hub.endpoint, repo=REPO)}" in ran.stderr
    assert "network" not in ran.stderr and "Traceback" not in ran.stderr
    assert EXIT_CODES[10] == "credentials refused"
    as_json = _stage(gated_hub, tmp_path, token, "--json", expect=10).json
    assert as_json["exit_code"] == 10 and said in as_json["error"]
    assert as_json["next"].startswith(step.format(endpoint=gated_hub.endpoint, repo=REPO)[:40])


def test_a_wrong_token_on_a_public_repo_is_refused_before_any_file(make_local_hub, tmp_path):
    server = make_local_hub(tokens={GOOD})
    server.hub.add_commit(REPO, small_release(tmp_path))
    ran = _stage(server, tmp_path, WRONG, expect=10)
    assert "refused the token" in ran.stderr
    assert not (tmp_path / "store").exists()
    assert not any("/resolve/" in r.url for r in server.hub.requests)


def test_the_granted_token_stages(gated_hub, tmp_path):
    _stage(gated_hub, tmp_path, GOOD, expect=0)
