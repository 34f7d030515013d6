"""The planner's prompts: each role's prompt settings (read from its adapter) and one renderer per role.

    prompts = PlannerPrompts.for_engine(engine, config, tokenizer)
    prompts.decider(state)                  # messages asking for the next action
    prompts.simulator(state, action)        # messages asking for the observation after `action`

An adapter is trained on one prompt layout, saved beside it as prompt_settings.json by `simplan
train` (data/episode.py); the planner renders exactly that layout. A run's explicit settings
(PlannerConfig.prompts: format / budget / max_history / max_failures) that contradict the
adapter's fail with both values named. An adapter without saved settings predates them and was
trained on per-step prompts; the base model (no adapter) gets the run's settings, per-step unless
`prompts: {format: conversation}` is given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simplan.data import format as fmt
from simplan.data.episode import (
    ConversationRenderer,
    EpisodeState,
    PromptSettings,
    merge_settings,
    read_settings,
    renderer_for,
)
from simplan.envs.actions import render_action
from simplan.envs.base import Action

FALLBACK_FORMAT = "step"  # no adapter settings and no prompt_format given: the layout adapters had before


def explicit_settings(config: Any) -> dict[str, Any]:
    """The prompt settings a PlannerConfig sets explicitly (its `prompts` section, whose fields are PromptSettings'
    own names; fields left at None are not set)."""
    return {key: value for key, value in dataclasses.asdict(config.prompts).items() if value is not None}


def role_settings(
    adapter_dir: str | None,
    saved: PromptSettings | None,
    explicit: dict[str, Any],
    role: str,
    fallback: str = FALLBACK_FORMAT,
) -> PromptSettings:
    """One role's settings: those `saved` with its adapter (checked against the explicit ones), else the explicit
    ones in the `fallback` format."""
    if adapter_dir and saved is not None:
        return merge_settings(
            saved, explicit, where=f"the {role} adapter ({Path(adapter_dir) / 'prompt_settings.json'})"
        )
    return PromptSettings(**{"format": fallback, **explicit})


@dataclass
class PlannerPrompts:
    decider_settings: PromptSettings
    simulator_settings: PromptSettings
    tokenizer: Any = None

    def __post_init__(self) -> None:
        if self.decider_settings.format != self.simulator_settings.format:
            raise ValueError(
                f"the decider adapter was trained on {self.decider_settings.format!r} prompts and the simulator on "
                f"{self.simulator_settings.format!r}; build and train both with the same --format"
            )
        self.conversation = self.decider_settings.format == "conversation"
        self._renderers: dict[str, ConversationRenderer] = {}
        if self.conversation:
            self._renderers = {
                "decider": renderer_for(self.decider_settings, self.tokenizer),
                "simulator": renderer_for(self.simulator_settings, self.tokenizer),
            }

    @staticmethod
    def for_engine(engine: Any, config: Any, tokenizer: Any = None) -> PlannerPrompts:
        dirs = getattr(engine, "adapter_dirs", None) or {}
        explicit = explicit_settings(config)
        adapter_dirs = {
            "decider": dirs.get(config.decider_adapter or ""),
            "simulator": dirs.get(config.simulator_adapter or ""),
        }
        saved = {role: read_settings(d) if d else None for role, d in adapter_dirs.items()}
        # A role without an adapter of its own (the reactive arm's simulator, a base-model decider) takes the
        # other role's format: one episode state is rendered for both.
        fallback = next((s.format for s in saved.values() if s is not None), FALLBACK_FORMAT)
        decider, simulator = (
            role_settings(adapter_dirs[role], saved[role], explicit, role, fallback)
            for role in ("decider", "simulator")
        )
        return PlannerPrompts(decider, simulator, tokenizer)

    def decider(self, state: fmt.PromptState | EpisodeState) -> fmt.Messages:
        if isinstance(state, EpisodeState):
            return self._renderers["decider"].decider_messages(state)
        return fmt.decider_messages(state)

    def simulator(self, state: fmt.PromptState | EpisodeState, action: Action) -> fmt.Messages:
        if isinstance(state, EpisodeState):
            return self._renderers["simulator"].simulator_messages(state, render_action(action))
        return fmt.simulator_messages(state, action)
