"""A platform whose package extra is not installed is bad input naming the extra, in a task and behind the Test
button alike -- never a ModuleNotFoundError in the middle of either."""

from __future__ import annotations

import sys

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.hooks import PLATFORMS, hook_class
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from tests.unit.fakes import Store, make_context

#: platform -> (the extra, a module that extra installs)
EXTRAS = {
    "slurm": ("slurm", "airflow.providers.ssh"),
    "docker": ("docker", "docker"),
    "kubernetes": ("kubernetes", "kubernetes_asyncio"),
    "lepton": ("lepton", "leptonai"),
}


def test_every_platform_that_needs_an_extra_names_it() -> None:
    needs = {name: hook_class(name).extra_modules for name in PLATFORMS}
    assert {name: extra[0] for name, extra in needs.items() if extra} == {k: v[0] for k, v in EXTRAS.items()}
    assert all(EXTRAS[name][1] in extra[1] for name, extra in needs.items() if extra)


@pytest.mark.parametrize("platform", sorted(EXTRAS))
def test_a_missing_extra_is_bad_input_in_the_task_and_the_test_button(
    platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra, module = EXTRAS[platform]
    conn_type = PLATFORMS[platform][0]
    monkeypatch.setenv("AIRFLOW_CONN_TAO_NO_EXTRA", f'{{"conn_type": "{conn_type}", "host": "gpu.example.com"}}')
    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    install = f"pip install 'airflow-provider-tao[{extra}]'"

    op = TAOSubmitOperator(task_id="train", conn_id="tao_no_extra", image="img:1", command="train.sh")
    with pytest.raises(AirflowFailException) as exc:
        op.execute(make_context(Store()))
    assert str(exc.value).startswith(f"Bad input, nothing was submitted: platform: the {platform} platform needs")
    assert module in str(exc.value) and install in str(exc.value)

    ok, message = hook_class(platform)(conn_id="tao_no_extra").test_connection()
    assert not ok and module in message and install in message, message
    assert "ModuleNotFoundError" not in message
