"""``get_provider_info()``: valid against Airflow's own schemas, and every name in it points at real code."""

from __future__ import annotations

import importlib
import inspect
import json
from importlib.metadata import distribution, entry_points
from pathlib import Path

import airflow
import jsonschema
import pytest
from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink
from airflow.triggers.base import BaseTrigger

from airflow_provider_tao.get_provider_info import get_provider_info
from airflow_provider_tao.hooks import PLATFORMS
from airflow_provider_tao.hooks.base import TAOPlatformHook

AIRFLOW_DIR = Path(airflow.__file__).parent
DIST = "airflow-provider-tao"


def _schema(name: str) -> dict:
    path = AIRFLOW_DIR / name
    assert path.is_file(), f"{name} is not next to the installed airflow package ({AIRFLOW_DIR})"
    return json.loads(path.read_text())


def _import_object(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(scope="module")
def info() -> dict:
    return get_provider_info()


# ----------------------------------------------------------------------------- schemas


def test_validates_against_airflows_provider_info_schema(info):
    schema = _schema("provider_info.schema.json")
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(info, schema)


def test_schema_validation_can_fail():
    # The check above is meaningful: the same schema rejects a broken provider info.
    schema = _schema("provider_info.schema.json")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x"}, schema)  # no description
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**get_provider_info(), "connection-types": [{"connection-type": "x"}]}, schema)


def test_connection_types_validate_against_the_provider_yaml_schema(info):
    # provider_info.schema.json does not describe conn-fields / ui-field-behaviour; provider.yaml's schema does.
    yaml_schema = _schema("provider.yaml.schema.json")
    subschema = {"definitions": yaml_schema.get("definitions", {}), **yaml_schema["properties"]["connection-types"]}
    jsonschema.validate(info["connection-types"], subschema)


def test_config_validates_against_the_provider_yaml_schema(info):
    yaml_schema = _schema("provider.yaml.schema.json")
    subschema = {"definitions": yaml_schema["definitions"], **yaml_schema["properties"]["config"]}
    jsonschema.validate(info["config"], subschema)


def test_ui_field_behaviour_validates_against_the_customized_fields_schema(info):
    schema = _schema("customized_form_field_behaviours.schema.json")
    for conn in info["connection-types"]:
        behaviour = conn.get("ui-field-behaviour")
        if behaviour:
            jsonschema.validate(
                {
                    "hidden_fields": behaviour.get("hidden-fields", []),
                    "relabeling": behaviour.get("relabeling", {}),
                    "placeholders": behaviour.get("placeholders", {}),
                },
                schema,
            )


# ----------------------------------------------------------------------------- registration


def test_entry_point_points_at_get_provider_info():
    ours = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_provider_tao")]
    assert len(ours) == 1
    assert ours[0].name == "provider_info"
    assert ours[0].load() is get_provider_info


def test_package_name_and_version_match_the_distribution(info):
    assert info["package-name"] == DIST
    assert distribution(DIST).version in info["versions"]
    assert info["name"] and info["description"]


def test_returns_a_fresh_json_document(info):
    assert json.loads(json.dumps(info)) == info
    assert get_provider_info() == info
    assert get_provider_info() is not get_provider_info()


# ----------------------------------------------------------------------------- every name points at real code


def _python_modules(info: dict, kind: str) -> list[str]:
    return [module for entry in info.get(kind, []) for module in entry["python-modules"]]


@pytest.mark.parametrize("kind", ["operators", "hooks", "triggers", "sensors", "transfers"])
def test_every_listed_module_imports(info, kind):
    for module in _python_modules(info, kind):
        importlib.import_module(module)


def test_listed_modules_hold_what_their_kind_says(info):
    def classes(module: str, base: type) -> list[type]:
        mod = importlib.import_module(module)
        return [
            obj
            for obj in vars(mod).values()
            if inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == module
        ]

    for module in _python_modules(info, "operators"):
        assert classes(module, BaseOperator), module
    for module in _python_modules(info, "hooks"):
        assert classes(module, BaseHook), module
    for module in _python_modules(info, "triggers"):
        assert classes(module, BaseTrigger), module


def test_every_integration_referenced_is_declared(info):
    declared = {i["integration-name"] for i in info["integrations"]}
    for kind in ("operators", "hooks", "triggers", "sensors"):
        for entry in info.get(kind, []):
            assert entry["integration-name"] in declared


def test_every_extra_link_imports_and_is_an_operator_link(info):
    assert info["extra-links"]
    for path in info["extra-links"]:
        link = _import_object(path)
        assert issubclass(link, BaseOperatorLink)
        assert link().name


def test_every_platform_hook_module_is_listed(info):
    listed = set(_python_modules(info, "hooks"))
    for _conn_type, class_path in PLATFORMS.values():
        assert _import_object(class_path).__module__ in listed  # where the class is defined, not the re-export


def test_hook_class_names_import_and_match_their_connection_type(info):
    assert info["connection-types"]
    for conn in info["connection-types"]:
        hook = _import_object(conn["hook-class-name"])
        assert issubclass(hook, TAOPlatformHook)
        # What ProvidersManager._import_hook requires, or it skips the hook with a warning.
        assert hook.conn_type == conn["connection-type"]
        assert hook.hook_name == conn["hook-name"]
        assert hook.conn_name_attr == "conn_id"
        assert hook.default_conn_name
        assert "conn_id" in inspect.signature(hook.__init__).parameters


def test_every_hook_has_test_connection(info, tmp_path, monkeypatch):
    # the design: each hook has its connection type, declarative form fields and test_connection(); the UI's
    # "Test" button is enabled only when the hook class defines it (ProvidersManager: connection_testable).
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    for conn in info["connection-types"]:
        hook_class = _import_object(conn["hook-class-name"])
        assert callable(getattr(hook_class, "test_connection", None)), f"{hook_class.__name__} has no test_connection"
        if conn["connection-type"] == "tao_local":
            ok, message = hook_class(conn_id=None).test_connection()
            assert ok is True and isinstance(message, str)


def test_every_connection_type_is_a_platform_and_vice_versa(info):
    declared = {c["connection-type"]: c["hook-class-name"] for c in info["connection-types"]}
    assert declared == {ctype: path for ctype, path in PLATFORMS.values()}
    for conn in info["connection-types"]:
        hook = _import_object(conn["hook-class-name"])
        assert hook.conn_type == conn["connection-type"]


def test_local_connection_fields_are_the_extras_the_hook_reads(info):
    local = next(c for c in info["connection-types"] if c["connection-type"] == "tao_local")
    assert set(local["conn-fields"]) == {"jobs_dir", "results_root", "cancel_grace_seconds"}
    for field in local["conn-fields"].values():
        assert field["label"] and field["description"]
    # the hidden standard fields really are unused by the local hook
    assert set(local["ui-field-behaviour"]["hidden-fields"]) >= {"host", "login", "password", "port"}


def test_secret_connection_fields_are_marked_as_passwords(info):
    for conn in info["connection-types"]:
        for name, field in conn.get("conn-fields", {}).items():
            if name == "image_pull_secret":
                continue  # the NAME of a Kubernetes Secret, not a secret value
            if any(word in name for word in ("token", "password", "secret", "private_key")):
                assert field["schema"].get("format") == "password", f"{conn['connection-type']}.{name}"


def test_config_declares_every_option_the_code_reads(info):
    options = info["config"]["tao"]["options"]
    assert {"local_jobs_dir", "local_results_root", "default_poll_interval", "outage_report_seconds"} <= set(options)
    assert float(options["default_poll_interval"]["default"]) > 0
    for name, option in options.items():
        assert option["description"], name
        assert option["version_added"] in info["versions"], name
