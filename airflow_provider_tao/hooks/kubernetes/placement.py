"""Where a ``kubernetes`` job may run: its node selector and tolerations, checked as the API server checks them
(``ValidatePodSpec``: label keys and values, the toleration operators and effects) before anything is submitted, so
a typo is a ``Bad input`` naming the setting, not a 422 after the Job's name was taken.

Either comes from a job's ``backend_details`` or from the connection's extras, where the form may hold it as JSON
text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
SELECTOR_EXAMPLE = '{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}'
TOLERATION_EXAMPLE = '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]'


def _parsed(value: Any, parameter: str, example: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)  # a connection extra typed as text in the form
    except ValueError as exc:
        raise JobValidationError(
            parameter, f"{value!r} is not JSON ({exc})", f"Write it as JSON, e.g. {example}"
        ) from exc


def _qualified_name(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(re.match(rf"^{_NAME}$", name))


def _label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def node_selector(value: Any, parameter: str) -> dict[str, str]:
    """The node selector as the pod spec takes it.

    :param parameter: how the error names the setting (``backend_details['node_selector']``, a connection extra).
    """
    selector = _parsed(value, parameter, SELECTOR_EXAMPLE)
    if not isinstance(selector, dict):
        raise JobValidationError(parameter, f"{selector!r} is not a mapping of node labels", f"Use {SELECTOR_EXAMPLE}")
    for key, label in selector.items():
        if not _qualified_name(key):
            raise JobValidationError(
                parameter,
                f"{key!r} is not a node label key",
                f"Use a label key such as nvidia.com/gpu.product: {SELECTOR_EXAMPLE}",
            )
        if not _label_value(label):
            raise JobValidationError(
                parameter,
                f"the value {label!r} of {key!r} is not a label value (text of at most 63 letters, digits, '-', '_', "
                "'.', starting and ending with a letter or digit)",
                f"Quote the value as text, e.g. {SELECTOR_EXAMPLE}",
            )
    return dict(selector)


def tolerations(value: Any, parameter: str) -> list[dict[str, Any]]:
    """The tolerations as the pod spec takes them.

    :param parameter: how the error names the setting.
    """
    items = _parsed(value, parameter, TOLERATION_EXAMPLE)
    if not isinstance(items, list):
        raise JobValidationError(parameter, f"{items!r} is not a list of tolerations", f"Use {TOLERATION_EXAMPLE}")
    for index, item in enumerate(items):
        where = f"{parameter}[{index}]"
        if not isinstance(item, dict) or set(item) - _TOLERATION_KEYS:
            unknown = sorted(set(item) - _TOLERATION_KEYS) if isinstance(item, dict) else item
            raise JobValidationError(
                where, f"{unknown!r} is not a toleration field", f"Use the fields {sorted(_TOLERATION_KEYS)}"
            )
        key, operator = item.get("key") or "", item.get("operator") or "Equal"
        problem = (
            f"operator {operator!r} is not one of {', '.join(_OPERATORS)}"
            if operator not in _OPERATORS
            else f"key {key!r} is not a taint key"
            if key and not _qualified_name(key)
            else "a toleration without a key must use operator Exists"
            if not key and operator != "Exists"
            else "operator Exists takes no value"
            if operator == "Exists" and item.get("value")
            else f"value {item.get('value')!r} is not a label value"
            if not _label_value(item.get("value") or "")
            else f"effect {item.get('effect')!r} is not one of NoSchedule, PreferNoSchedule, NoExecute"
            if (item.get("effect") or "") not in _EFFECTS
            else "tolerationSeconds needs effect NoExecute and a whole number"
            if "tolerationSeconds" in item
            and (item.get("effect") != "NoExecute" or not isinstance(item["tolerationSeconds"], int))
            else None
        )
        if problem:
            raise JobValidationError(where, problem, f"Use e.g. {TOLERATION_EXAMPLE}")
    return list(items)
