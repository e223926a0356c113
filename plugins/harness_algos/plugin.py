"""Registers the first-party algorithms. Algorithm modules import only numpy and harness (the
backend brings the framework), so listing plugins imports no framework."""

from __future__ import annotations

from harness import hookimpl
from harness.registry import AlgorithmSpec
from harness_algos import (
    a2c,
    bcq,
    cql,
    cql_discrete,
    ddpg,
    dqn,
    es,
    impala,
    maddpg,
    mappo,
    pg,
    ppo,
    qmix,
    r2d2,
    random_policy,
    sac,
    td3,
)


@hookimpl
def harness_register_algorithms() -> list[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            "a2c",
            make_agent=a2c.make_agent,
            config_cls=a2c.A2CConfig,
            action_spaces=("discrete", "box"),
            description="A2C (synchronous advantage actor-critic, n-step/GAE returns)",
        ),
        AlgorithmSpec(
            "dqn",
            make_agent=dqn.make_agent,
            make_algorithm=dqn.DQN,
            make_policy=dqn.make_policy,
            config_cls=dqn.DQNConfig,
            action_spaces=("discrete",),
            description="DQN with double, dueling and prioritized-replay options",
        ),
        AlgorithmSpec(
            "r2d2",
            make_agent=r2d2.make_agent,
            config_cls=r2d2.R2D2Config,
            action_spaces=("discrete",),
            description="R2D2 (recurrent DQN: stored states, burn-in, prioritized sequence replay)",
        ),
        AlgorithmSpec(
            "pg",
            make_agent=pg.make_agent,
            config_cls=pg.PGConfig,
            action_spaces=("discrete", "box"),
            description="REINFORCE with a learned value baseline (policy gradient)",
        ),
        AlgorithmSpec(
            "ppo",
            make_agent=ppo.make_agent,
            config_cls=ppo.PPOConfig,
            action_spaces=("discrete", "box"),
            description="PPO (clipped objective, GAE, vectorized envs)",
        ),
        AlgorithmSpec(
            "ddpg",
            make_agent=ddpg.make_agent,
            make_algorithm=ddpg.DDPG,
            make_policy=ddpg.make_policy,
            config_cls=ddpg.DDPGConfig,
            action_spaces=("box",),
            description="DDPG with PARL's multi-head ensemble option (ensemble = K)",
        ),
        AlgorithmSpec(
            "td3",
            make_agent=td3.make_agent,
            make_algorithm=td3.TD3,
            make_policy=td3.make_policy,
            config_cls=td3.TD3Config,
            action_spaces=("box",),
            description="TD3 (twin critics, target smoothing, delayed actor updates)",
        ),
        AlgorithmSpec(
            "sac",
            make_agent=sac.make_agent,
            make_algorithm=sac.SAC,
            make_policy=sac.make_policy,
            config_cls=sac.SACConfig,
            action_spaces=("box",),
            description="SAC with automatic entropy tuning",
        ),
        AlgorithmSpec(
            "es",
            make_agent=es.make_agent,
            config_cls=es.ESConfig,
            action_spaces=("discrete", "box"),
            description="OpenAI evolution strategies (shared noise table, antithetic, farm)",
        ),
        AlgorithmSpec(
            "impala",
            make_agent=impala.make_agent,
            config_cls=impala.IMPALAConfig,
            action_spaces=("discrete", "box"),
            description="IMPALA (V-trace actor-critic; asynchronous actors with a bounded lag)",
        ),
        AlgorithmSpec(
            "bcq",
            make_agent=bcq.make_agent,
            config_cls=bcq.BCQConfig,
            action_spaces=("box",),
            description="BCQ, offline from a Minari dataset (VAE + perturbation actor + twin "
            "critics)",
        ),
        AlgorithmSpec(
            "cql",
            make_agent=cql.make_agent,
            config_cls=cql.CQLConfig,
            action_spaces=("box",),
            description="CQL(H) on SAC, offline from a Minari dataset (fixed or tuned alpha)",
        ),
        AlgorithmSpec(
            "cql-discrete",
            make_agent=cql_discrete.make_agent,
            config_cls=cql_discrete.CQLDiscreteConfig,
            action_spaces=("discrete",),
            description="discrete CQL(H) on double DQN, offline from a Minari dataset",
        ),
        AlgorithmSpec(
            "random",
            make_agent=random_policy.make_agent,
            make_algorithm=random_policy.make_algorithm,
            make_policy=random_policy.make_policy,
            config_cls=random_policy.RandomConfig,
            action_spaces=("discrete", "box"),
            description="uniformly random actions, no learning (floor and overhead baseline)",
            agents="any",
        ),
        AlgorithmSpec(
            "maddpg",
            make_agent=maddpg.make_agent,
            config_cls=maddpg.MADDPGConfig,
            action_spaces=("discrete", "box"),
            agents="multi",
            description="MADDPG (centralised critics, decentralised actors; Gumbel-softmax for "
            "discrete actions)",
        ),
        AlgorithmSpec(
            "qmix",
            make_agent=qmix.make_agent,
            config_cls=qmix.QMIXConfig,
            action_spaces=("discrete",),
            agents="multi",
            description="QMIX (monotonic mixing of shared agent Qs, GRU option, episode replay)",
        ),
        AlgorithmSpec(
            "mappo",
            make_agent=mappo.make_agent,
            config_cls=mappo.MAPPOConfig,
            action_spaces=("discrete", "box"),
            agents="multi",
            description="MAPPO (shared actor, centralised critic on the global state)",
        ),
    ]
