"""A renderer for the subset of kustomize that deploy/k8s uses, so CI can render the overlays
without the kustomize binary (not installable from the registries CI reaches).

Supported kustomization fields: ``resources`` (files and directories holding a kustomization),
``namespace``, ``images`` (``newName``/``newTag``), ``replicas`` and ``patches`` given by ``path``
(strategic merge: maps merge, lists of named items merge by ``name``, other lists are replaced,
a ``null`` value deletes the key). Any other field raises, so a manifest never silently renders
differently here than under ``kubectl apply -k``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "patches"}
Doc = dict[str, Any]


class Unsupported(Exception):
    """The kustomization uses a field this renderer does not implement."""


def render(directory: Path) -> list[Doc]:
    """The documents ``kubectl kustomize directory`` prints, in resource order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise Unsupported(f"{directory}: {sorted(unknown)}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise Unsupported(f"{directory}: patches other than by path: {patch_entry}")
        patch = yaml.safe_load((directory / patch_entry["path"]).read_text())
        [target] = [d for d in docs if _key(d) == _key(patch)] or [None]
        if target is None:
            raise Unsupported(f"{directory}: patch {patch_entry['path']} matches no resource")
        docs[docs.index(target)] = merge(target, patch)
    for replica in kustomization.get("replicas", []):
        [target] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == replica["name"]]
        target["spec"]["replicas"] = replica["count"]
    for image in kustomization.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    if "namespace" in kustomization:
        for doc in docs:
            doc["metadata"]["namespace"] = kustomization["namespace"]
    return docs


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` onto a copy of ``base``."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out_list = copy.deepcopy(base)
        names = [item["name"] for item in out_list]
        for item in patch:
            if item["name"] in names:
                i = names.index(item["name"])
                out_list[i] = merge(out_list[i], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


def _key(doc: Doc) -> tuple[str, str, str]:
    return doc["apiVersion"], doc["kind"], doc["metadata"]["name"]


def _containers(doc: Doc) -> list[Doc]:
    template = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*template.get("initContainers", []), *template.get("containers", [])]
