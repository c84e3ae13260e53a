"""The FSDP door's state across world sizes (gradzip.fsdp.State.state_dict(portable=True)).

The FSDP door keeps its error feedback per FSDP module and reduce-scatter input ("<module
key>:<input numel>"): a rank's residual and velocity have the input's layout, P chunks of
every parameter's padded dim-0 shard (gradzip.fsdp_layout), which changes with the world
size. to_parameters() cuts that layout into each parameter's tensor (its P shards in rank
order, the padding dropped), under "<module key>:<parameter names>/<parameter>/<field>",
with the counters under "<module key>:<parameter names>/<field>" and each piece's level
under its parameter; gradzip.world_portable's rule then averages them over the ranks.
to_inputs() lays such a state out for the world size the modules are sharded over now.
Parameters sharded on another dim than 0 (tensor parallelism) have no such rule here: both
refuse them by name.
"""
import torch

from .checkpoint import CheckpointError
from .fsdp_layout import parameter_shards, shard_layout
from .world_portable import MASS_FIELDS

ROOT = "(root)"  # the key of the model's own FSDP module (gradzip.fsdp.compress)


def module_name(module_key: str) -> str:
    """The name in the model of the FSDP module keyed `module_key`."""
    return "" if module_key == ROOT else module_key


def _shards(modules: dict, module_key: str) -> dict:
    """parameter_shards() of a module, its failures as CheckpointErrors."""
    try:
        return parameter_shards(modules[module_key], module_name(module_key))
    except AttributeError as e:
        raise CheckpointError(f"gradzip.fsdp: this torch's FSDP2 does not expose its parameters' shards ({e})") from e
    except ValueError as e:
        raise CheckpointError(str(e)) from e


def _split(name: str) -> tuple[str, str]:
    """"<key>/<rest>" as (key, rest)."""
    key, _, rest = name.partition("/")
    return key, rest


def to_parameters(tensors: dict, modules: dict, world: int) -> dict:
    """One rank's state (input-keyed) with its residuals and velocities per parameter."""
    out = {}
    for name, value in tensors.items():
        key, rest = _split(name)
        module_key, _, numel = key.rpartition(":")
        if module_key not in modules:
            raise CheckpointError(f"gradzip.fsdp: the state holds {key!r}, of no FSDP module compress() set")
        chunk = int(numel) // world
        pieces, why = shard_layout(modules[module_key], chunk, module_name(module_key))
        if pieces is None:
            raise CheckpointError(f"gradzip.fsdp: state_dict(portable=True) cannot cut {key!r} by parameter: {why}")
        portable_key = f"{module_key}:{','.join(p for p, _ in pieces)}"
        if rest not in MASS_FIELDS:
            out[f"{portable_key}/{rest}"] = value
            continue
        shards = _shards(modules, module_key)
        rows = value.view(world, chunk)
        offset = 0
        for parameter, padded in pieces:
            whole = rows[:, offset:offset + padded].reshape(-1)
            full = shards[parameter].numel
            if whole[full:].any():  # the padding's input is zero: nothing can be left there
                raise CheckpointError(f"gradzip.fsdp: {name!r} holds error feedback in parameter {parameter!r}'s "
                                      "padding; the state does not match this model's layout")
            out[f"{portable_key}/{parameter}/{rest}"] = whole[:full].clone()
            offset += padded
    return out


def to_inputs(tensors: dict, modules: dict) -> dict:
    """A portable state (parameter-keyed) as the modules' reduce-scatter inputs lay it out
    at the world size they are sharded over now."""
    out, residuals = {}, {}
    for name, value in tensors.items():
        key, rest = _split(name)
        module_key, _, names = key.rpartition(":")
        if module_key not in modules:
            raise CheckpointError(f"gradzip.fsdp: the saved state holds {module_key!r}, which is not an FSDP module "
                                  "of this model")
        shards = _shards(modules, module_key)
        parameters = names.split(",")
        missing = [p for p in parameters if p not in shards]
        if missing:
            raise CheckpointError(f"gradzip.fsdp: the saved state holds parameters {missing} that FSDP module "
                                  f"{module_key!r} does not shard")
        world = shards[parameters[0]].world
        chunk = sum(shards[p].padded for p in parameters)
        input_key = f"{module_key}:{world * chunk}"
        field = rest.rsplit("/", 1)[-1]
        if field not in MASS_FIELDS:
            out[f"{input_key}/{rest}"] = value
            continue
        parameter = rest[: -len(field) - 1]
        if value.numel() != shards[parameter].numel:
            raise CheckpointError(f"gradzip.fsdp: the saved {name!r} has {value.numel()} elements, parameter "
                                  f"{parameter!r} {shards[parameter].numel}")
        offset = sum(shards[p].padded for p in parameters[: parameters.index(parameter)])
        rows = residuals.setdefault((input_key, field), torch.zeros(world, chunk, dtype=value.dtype))
        padded = torch.zeros(world * shards[parameter].padded, dtype=value.dtype)
        padded[: value.numel()] = value
        rows[:, offset:offset + shards[parameter].padded] = padded.view(world, -1)
    for (input_key, field), rows in residuals.items():
        out[f"{input_key}/{field}"] = rows.view(-1)
    return out
