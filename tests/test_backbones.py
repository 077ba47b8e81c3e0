"""Memory backbones (jaxwm/nets/backbones): one interface, and the invariants PPO relies on.

For every backbone: a sequence call equals stepping one step at a time (so a rollout's
starting carry is all training needs); a reset gives exactly the output a fresh carry gives
(no memory leaks across episodes); and inputs before a reset do not change anything after it.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwm.config
from jaxwm.config import ConfigError
from jaxwm.nets import backbones
from jaxwm.nets.actor_critic import make_actor_critic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, STEPS, FEATURES = 2, 9, 5
# Small sizes so every backbone compiles in seconds; chunks and memory shorter than STEPS so
# the chunked and windowed paths cross boundaries inside the sequence.
SMALL = {"rnn.hidden": 8, "trxl.dim": 8, "trxl.layers": 2, "trxl.heads": 2, "trxl.memory": 3,
         "mamba.dim": 8, "mamba.state": 4, "mamba2.dim": 8, "mamba2.state": 4,
         "mamba2.headdim": 4, "mamba2.chunk": 4}


def network_config(backbone, **overrides):
    overrides = {f"network.{k}": v for k, v in {**SMALL, **overrides}.items()}
    return jaxwm.config.load("ppo:cartpole_masked",
                             {"network.backbone": backbone, **overrides}).network


def _inputs(seed=0):
    x = jax.random.normal(jax.random.PRNGKey(seed), (BATCH, STEPS, FEATURES))
    reset = jnp.zeros((BATCH, STEPS), bool).at[0, 4].set(True).at[1, 0].set(True)
    return x, reset


def _build(name, scan=None):
    overrides = {"mamba.scan": scan} if scan else {}
    module = backbones.make(network_config(name, **overrides))
    x, reset = _inputs()
    carry = module.initialize_carry(BATCH)
    params = module.init(jax.random.PRNGKey(1), carry, x, reset)
    return module, params, carry


CASES = [(name, None) for name in backbones.NAMES] + [("mamba", "associative"),
                                                      ("mamba", "sequential")]


@pytest.mark.parametrize("name,scan", CASES)
def test_sequence_call_equals_stepping_with_resets(name, scan):
    module, params, carry = _build(name, scan)
    x, reset = _inputs()
    final, y = module.apply(params, carry, x, reset)
    assert y.shape[:2] == (BATCH, STEPS)
    step_carry, ys = carry, []
    for t in range(STEPS):
        step_carry, y_t = module.apply(params, step_carry, x[:, t], reset[:, t],
                                       method=module.step)
        ys.append(y_t)
    np.testing.assert_allclose(jnp.stack(ys, 1), y, rtol=2e-4, atol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5),
                 step_carry, final)
    # Two halves, the second from the first's carry, give the same as one call.
    mid, y1 = module.apply(params, carry, x[:, :5], reset[:, :5])
    _, y2 = module.apply(params, mid, x[:, 5:], reset[:, 5:])
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", backbones.NAMES)
def test_reset_forgets_everything_before_it(name):
    module, params, carry = _build(name)
    x, reset = _inputs()
    _, y = module.apply(params, carry, x, reset)
    # Sequence 0 resets at step 4: from there on it must match a fresh carry started at 4...
    fresh = module.initialize_carry(BATCH)
    _, y_fresh = module.apply(params, fresh, x[:, 4:], reset[:, 4:].at[:, 0].set(True))
    np.testing.assert_allclose(y[0, 4:], y_fresh[0], rtol=2e-4, atol=2e-5)
    # ...and whatever came before it (other inputs, another carry) must not matter.
    noisy_x = x.at[0, :4].add(3.0)  # before sequence 0's reset only
    noisy_carry = jax.tree.map(lambda leaf: leaf + 1 if leaf.dtype != bool else ~leaf, carry)
    _, y_noisy = module.apply(params, noisy_carry, noisy_x, reset)
    np.testing.assert_allclose(y_noisy[0, 4:], y[0, 4:], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(y_noisy[1], y[1], rtol=2e-4, atol=2e-5)  # reset at step 0
    if name != "ff":  # without a reset the memory is used: the outputs differ
        assert not np.allclose(y_noisy[0, :4], y[0, :4])


@pytest.mark.parametrize("name", backbones.NAMES)
def test_actor_critic_with_each_backbone(name):
    """The PPO network: carry (frames, memory); the critic reads the memory for memory
    backbones; a 4-frame window for vector observations."""
    from jaxwm.envs.types import EnvSpec

    spec = EnvSpec(env_id="CartPole-v1", family="classic", obs_shape=(4,), obs_dtype=np.float32,
                   num_envs=BATCH, discrete=True, num_actions=2, action_shape=(),
                   action_low=None, action_high=None, max_episode_steps=500)
    config = network_config(name, frames=4 if name == "ff" else 1)
    net = make_actor_critic(spec, config)
    assert net.has_memory
    assert net.separate_critic is False  # BenchNetRL's agents: one torso for both heads
    obs = jax.random.normal(jax.random.PRNGKey(0), (BATCH, STEPS, 4))
    reset = jnp.zeros((BATCH, STEPS), bool)
    carry = net.initialize_carry(BATCH)
    params = net.init(jax.random.PRNGKey(1), carry, obs, reset)
    carry, dist, value = net.apply(params, carry, obs, reset)
    assert value.shape == (BATCH, STEPS) and dist.logits.shape == (BATCH, STEPS, 2)
    if name != "ff":
        # The value at a late step depends on an early observation through the memory.
        grad = jax.grad(lambda o: net.apply(params, net.initialize_carry(BATCH), o,
                                            reset)[2][:, -1].sum())(obs)
        assert float(jnp.abs(grad[:, -2]).sum()) > 0  # the step before


@pytest.mark.parametrize("name, block", [("ff", "ff"), ("gru", "rnn"), ("lstm", "rnn"),
                                         ("mamba", None)])
def test_each_head_gets_the_hidden_layers_of_its_backbones_block(name, block):
    """``ff.head_hidden`` (BenchNetRL's FF agent) and ``rnn.head_hidden`` (Craftax_Baselines'
    GRU agent) give each head that many ReLU layers; the other backbones' heads read the
    backbone directly."""
    from jaxwm.envs.types import EnvSpec

    spec = EnvSpec(env_id="CartPole-v1", family="classic", obs_shape=(4,), obs_dtype=np.float32,
                   num_envs=BATCH, discrete=True, num_actions=2, action_shape=(),
                   action_low=None, action_high=None, max_episode_steps=500)
    overrides = {f"{block}.head_hidden": (6, 7)} if block else {}
    net = make_actor_critic(spec, network_config(name, **overrides))
    assert net.head_hidden == ((6, 7) if block else ())
    carry = net.initialize_carry(BATCH)
    obs, reset = jnp.zeros((BATCH, STEPS, 4)), jnp.zeros((BATCH, STEPS), bool)
    params = net.init(jax.random.PRNGKey(0), carry, obs, reset)["params"]
    widths = sorted(leaf.shape[-1] for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                    if "MLP" in jax.tree_util.keystr(path) and leaf.ndim == 2)
    assert widths.count(6) == (2 if block else 0) and widths.count(7) == (2 if block else 0)


@pytest.mark.parametrize("overrides,message", [
    ({"backbone": "lstn"}, "Did you mean 'lstm'"),
    ({"backbone": "gtrxl", "trxl.dim": 10, "trxl.heads": 3}, "divisible by the heads"),
    ({"backbone": "trxl", "trxl.memory": 0}, "trxl.memory must be >= 1"),
    ({"backbone": "mamba", "mamba.scan": "fast"}, "mamba.scan='fast' is unknown"),
    ({"backbone": "mamba2", "mamba2.headdim": 5}, "headdim"),
    ({"backbone": "ff", "frames": 0}, "frames must be >= 1"),
])
def test_bad_backbone_settings_are_one_line_errors(overrides, message):
    config = network_config("ff")
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    with pytest.raises(ConfigError, match=message):
        backbones.validate(config)


def test_learning_rate_scale_reaches_only_the_backbone():
    from jaxwm.agents import ppo as ppo_agent

    cfg = jaxwm.config.load("ppo:cartpole_masked")
    params = {"params": {"memory": {"w": jnp.ones(3)}, "Dense_0": {"w": jnp.ones(3)}}}
    cfg.ppo.anneal_lr = False
    opt = ppo_agent.make_optimizer(cfg.ppo, 10, backbone_scale=0.4)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = opt.update(grads, opt.init(params), params)
    ratio = updates["params"]["memory"]["w"] / updates["params"]["Dense_0"]["w"]
    np.testing.assert_allclose(ratio, 0.4, rtol=1e-6)


def test_update_resets_flag_only_matters_where_an_episode_starts_mid_sequence():
    """ppo.update_resets=False reproduces BenchNetRL's Mamba update (memory not reset inside
    training sequences): the loss then differs exactly when a sequence holds an episode start."""
    from jaxwm.agents import ppo as ppo_agent
    from jaxwm.envs.types import EnvSpec

    spec = EnvSpec(env_id="CartPole-v1", family="classic", obs_shape=(4,), obs_dtype=np.float32,
                   num_envs=BATCH, discrete=True, num_actions=2, action_shape=(),
                   action_low=None, action_high=None, max_episode_steps=500)
    net = make_actor_critic(spec, network_config("mamba"))
    obs = jax.random.normal(jax.random.PRNGKey(0), (BATCH, STEPS, 4))
    carry = net.initialize_carry(BATCH)
    params = net.init(jax.random.PRNGKey(1), carry, obs, jnp.zeros((BATCH, STEPS), bool))
    cfg = jaxwm.config.load("ppo:cartpole_masked").ppo

    def loss(is_first, update_resets):
        hyper = ppo_agent.PPOHyper.from_config(cfg, recurrent=True).replace(
            update_resets=update_resets)
        batch = dict(obs=obs, is_first=is_first, initial_carry=carry,
                     action=jnp.zeros((BATCH, STEPS), jnp.int32),
                     log_prob=jnp.full((BATCH, STEPS), -0.7), value=jnp.zeros((BATCH, STEPS)),
                     valid=jnp.ones((BATCH, STEPS), bool), advantages=jnp.ones((BATCH, STEPS)),
                     returns=jnp.ones((BATCH, STEPS)))
        return float(ppo_agent.loss_fn(params, net, hyper, batch)[0])

    no_start = jnp.zeros((BATCH, STEPS), bool)
    mid_start = no_start.at[:, 4].set(True)
    assert loss(no_start, True) == loss(no_start, False)
    assert loss(mid_start, True) != loss(mid_start, False)


@pytest.mark.parametrize("steps", [1, 12])  # 1: the query-side form (acting); 12: the standard one
def test_attention_equals_flax_multi_head_attention(steps):
    """TrXL's attention (``transformer.Attention``) has flax's parameters and init, and in
    either of its forms gives flax's ``MultiHeadDotProductAttention`` output."""
    import flax.linen as nn

    from jaxwm.nets.backbones.transformer import Attention

    batch, keys_len, dim, heads = 3, 7, 16, 2
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    queries = jax.random.normal(k[0], (batch, steps, dim))
    keys = jax.random.normal(k[1], (batch, keys_len, dim))
    mask = jax.random.bernoulli(k[2], 0.6, (batch, steps, keys_len)).at[..., -1].set(True)
    flax_attention = nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=dim)
    flax_params = flax_attention.init(jax.random.PRNGKey(1), queries, keys, mask=mask[:, None])
    params = Attention(heads).init(jax.random.PRNGKey(1), queries, keys, mask)
    jax.tree.map(np.testing.assert_array_equal, params, flax_params)
    expected = flax_attention.apply(flax_params, queries, keys, mask=mask[:, None])
    np.testing.assert_allclose(Attention(heads).apply(params, queries, keys, mask), expected,
                               rtol=1e-5, atol=1e-6)
