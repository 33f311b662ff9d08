"""One shape for "a setting is wrong", whichever layer finds it: the stack's settings, a model's
description, a node's boot settings, the planner's flags."""

from __future__ import annotations


class SettingError(ValueError):
    """A setting that cannot work, found before anything is created.

    ``setting`` names it as the caller gave it (a stack key, a flag, a boot field); ``message``
    says what is wrong and how to fix it."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        self.message = message
        super().__init__(f"{self.label}: {message}" if self.label else message)

    @property
    def label(self) -> str:
        """What the error's text starts with: the setting, unless the message names it."""
        return self.setting
