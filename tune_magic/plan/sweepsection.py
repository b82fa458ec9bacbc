"""A YAML cell body's ``sweep:`` mapping: the sweep axes written as a mapping, taken out of the body.

A YAML cell body may hold a top-level ``sweep:`` mapping of keys (dotted, or nested mappings) to
lists of values, removed from the body before it becomes the config overlay
(:func:`split_sweep_section`)::

    sweep:
      optimizer.lr: [1.0e-4, 3.0e-4]
      model.lora_attn_modules: [[q_proj], [q_proj, v_proj]]

Item texts become override values (:func:`split_sweep_section`), checked like any axis item by
:func:`tune_magic.plan.axes.axis_from_items` when :func:`tune_magic.plan.sweep.plan_sweep`
builds the trials. PyYAML and OmegaConf are imported only when a body is read.
"""

from __future__ import annotations

from tune_magic.errors import PlanError

__all__ = ["split_sweep_section"]


def _node_text(node, resolver) -> str:
    """An override value for one YAML node of a ``sweep:`` list, as typed where it can be."""
    import yaml

    from tune_magic.plan.overrides import yaml_quoted

    if isinstance(node, yaml.ScalarNode):
        kind = node.tag.rsplit(":", 1)[-1]
        implicit = resolver.resolve(yaml.ScalarNode, node.value, (True, False))
        if not node.style and node.tag == implicit:  # plain, untagged ("" from the C parser, None from PyYAML)
            return _plain_text(node.value)
        if kind == "str":
            return yaml_quoted("k", node.value)[2:]
        return f"!!{kind} {node.value}"
    if isinstance(node, yaml.SequenceNode):
        return "[" + ", ".join(_node_text(n, resolver) for n in node.value) + "]"
    if isinstance(node, yaml.MappingNode):
        return "{" + ", ".join(f"{_node_text(k, resolver)}: {_node_text(v, resolver)}" for k, v in node.value) + "}"
    raise PlanError(f"sweep: cannot read the YAML node {node!r}")  # pragma: no cover - compose makes only these


def _plain_text(text: str) -> str:
    """A plain YAML scalar of a body as an override value: as typed, unless an override refuses
    that text for reading as something else (``yes``, ``010``, ``~``, ``1:30``), where the body
    means that something else: then the value the body gives, written plainly (``true``, ``8``,
    ``null``, ``90``)."""
    from tune_magic.plan.overrides import check_value, recipe_value, yaml_quoted

    try:
        check_value("k", text)
        return text
    except PlanError:
        pass
    value = recipe_value("k", text)  # what OmegaConf reads in the body too: the same loader
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    return yaml_quoted("k", str(value))[2:]


def _mapping_axes(node, prefix: str, line_of, resolver) -> list[tuple[str, list[str]]]:
    import yaml

    out: list[tuple[str, list[str]]] = []
    for key_node, value in node.value:
        key = f"{prefix}{key_node.value}" if isinstance(key_node, yaml.ScalarNode) else prefix + "?"
        where = f"cell line {line_of(key_node)}: sweep: {key}"
        if isinstance(value, yaml.MappingNode):
            out += _mapping_axes(value, key + ".", line_of, resolver)
        elif isinstance(value, yaml.SequenceNode):
            if not value.value:
                raise PlanError(f"{where} has no values; give a list of at least one value, e.g. {key}: [1, 2]")
            out.append((key, [_node_text(n, resolver) for n in value.value]))
        else:
            raise PlanError(f"{where} must be a list of values, e.g. {key}: [1.0e-4, 3.0e-4] (a list value is a "
                            f"nested list: {key}: [[q_proj], [q_proj, v_proj]])")
    return out


def split_sweep_section(text: str) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """Take the top-level ``sweep:`` mapping out of a YAML cell body.

    Args:
        text: a YAML body that is a mapping (already checked by
            :func:`tune_magic.plan.cellbody.parse_cell_body`).

    Returns:
        ``(rest, axes)``: ``rest`` is ``text`` without the ``sweep:`` key and its lines (other
        lines unchanged), or ``None`` when nothing else is left; ``axes`` is ``[(key, [item
        texts])]`` in the section's order, nested mappings joined with dots. Item texts are
        override values: plain scalars as typed (``1.0e-4``), quoted scalars YAML-quoted
        (``'a,b'``), lists and mappings in flow style (``[q_proj, v_proj]``). With no ``sweep:``
        key: ``(text, [])``.

    Raises:
        PlanError: ``sweep:`` is not a mapping of keys to non-empty lists, or the body is a flow
            mapping (``{...}``) from which the section cannot be cut as lines.
    """
    import yaml

    from tune_magic.plan.overrides import yaml_loader

    loader = yaml_loader()
    top = yaml.compose(text, Loader=loader)
    if not isinstance(top, yaml.MappingNode):
        return text, []
    found = [(k, v) for k, v in top.value if isinstance(k, yaml.ScalarNode) and k.value == "sweep"]
    if not found:
        return text, []
    key_node, value = found[0]
    line_of = lambda n: n.start_mark.line + 1  # noqa: E731 - cell lines count from 1
    if top.flow_style:
        raise PlanError("the cell body's sweep: is inside a flow mapping ({...}); write the body as key: value lines "
                        "with sweep: as a block")
    if isinstance(value, yaml.ScalarNode) and value.tag.endswith(":null"):
        axes: list[tuple[str, list[str]]] = []
    elif not isinstance(value, yaml.MappingNode):
        raise PlanError(f"cell line {line_of(key_node)}: sweep: must map keys to lists of values, e.g.\n"
                        "sweep:\n  optimizer.lr: [1.0e-4, 3.0e-4]")
    else:
        resolver = loader("")
        try:
            axes = _mapping_axes(value, "", line_of, resolver)
        finally:
            resolver.dispose()
    lines = text.splitlines(keepends=True)
    end = value.end_mark.line if value.end_mark.column == 0 else value.end_mark.line + 1
    rest = "".join(lines[:key_node.start_mark.line] + lines[end:])
    meaningful = [ln for ln in rest.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return (rest if meaningful else None), axes
