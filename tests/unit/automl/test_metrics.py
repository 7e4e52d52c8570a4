"""Live metrics from a trial's log lines: every recognised form, chunks split anywhere, state through JSON."""

from __future__ import annotations

from airflow_provider_tao.automl.metrics import MetricParser, final_values


def reports(text: str, names: tuple[str, ...] = ("val_loss",)) -> list[tuple[int, dict[str, float]]]:
    return [(r.step, r.values) for r in MetricParser(names).feed(text, final=True)]


def test_tao_metric_json_lines() -> None:
    text = 'noise\nTAO_METRIC {"step": 3, "val_loss": 0.41, "acc": 0.9}\nTAO_METRIC {"epoch": 4, "val_loss": 0.3}\n'
    assert reports(text, ("val_loss", "acc")) == [(3, {"val_loss": 0.41, "acc": 0.9}), (4, {"val_loss": 0.3})]


def test_free_forms_on_lines_that_say_their_step() -> None:
    text = (
        "epoch 1 train_loss=0.9 val_loss=0.5\n"
        "Epoch 2/10: loss: 0.8, val_loss: 0.45\n"
        "step 3 val_loss 4.1e-1\n"
        "val_loss=0.1 but no step here\n"
        "epoch 5 my_val_loss=0.2 val_loss_ema=0.3\n"
    )
    assert reports(text) == [(1, {"val_loss": 0.5}), (2, {"val_loss": 0.45}), (3, {"val_loss": 0.41})]


def test_keras_epoch_line_then_its_metrics_line() -> None:
    text = "Epoch 1/3\n10/10 [======] - 1s 5ms/step - loss: 0.70 - val_loss: 0.61\nEpoch 2/3\n10/10 - val_loss: 0.5\n"
    assert reports(text) == [(1, {"val_loss": 0.61}), (2, {"val_loss": 0.5})]


def test_tao_status_json_kpi_lines() -> None:
    text = '{"date": "1/1/2026", "status": "RUNNING", "epoch": 7, "kpi": {"val_loss": 0.2, "mAP": 0.5}}\n'
    assert reports(text, ("val_loss", "mAP")) == [(7, {"val_loss": 0.2, "mAP": 0.5})]


def test_nan_and_inf_are_not_values() -> None:
    assert reports('epoch 1 val_loss=nan\nTAO_METRIC {"step": 2, "val_loss": Infinity}\n') == []


def test_chunks_split_mid_line_and_state_through_json() -> None:
    parser = MetricParser(("val_loss",))
    assert parser.feed("Epoch 4/9\nxx - val_lo") == []
    resumed = MetricParser.from_json(("val_loss",), parser.to_json())
    assert [(r.step, r.values) for r in resumed.feed("ss: 0.25\n")] == [(4, {"val_loss": 0.25})]


def test_metrics_json_top_level_or_kpi() -> None:
    assert final_values({"val_loss": 0.2, "kpi": {"acc": 0.9}}, ("val_loss", "acc", "x")) == {
        "val_loss": 0.2,
        "acc": 0.9,
    }
    assert final_values(None, ("val_loss",)) == {}
