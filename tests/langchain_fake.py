"""A LangChain chat model over the OpenAI SDK, standing in for ``langchain_openai.ChatOpenAI``.

langchain-openai is not a dependency of the tests; this model does what
``ChatOpenAI(max_retries=0, include_response_headers=True)`` does with a
chat call: one SDK request per ``invoke``, the usage in ``usage_metadata``
and the answer's HTTP headers in ``response_metadata["headers"]`` (and
``generation_info``).  The HTTP is real: the OpenAI SDK over loopback.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core")

import openai
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr


class SdkChatModel(BaseChatModel):
    base_url: str
    api_key: str = "sk-fake"
    model: str = "gpt-4o-mini"
    max_tokens: int = 20
    max_retries: int = 0
    include_response_headers: bool = True
    _client: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=self.max_retries
        )

    @property
    def _llm_type(self) -> str:
        return "sdk-openai-chat"

    def close(self) -> None:
        self._client.close()

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        raw = self._client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=[{"role": "user", "content": str(m.content)} for m in messages],
            max_tokens=self.max_tokens,
        )
        completion = raw.parse()
        usage = completion.usage
        info: dict[str, Any] = {}
        if self.include_response_headers:
            info["headers"] = dict(raw.headers)
        message = AIMessage(
            content=completion.choices[0].message.content or "",
            usage_metadata={
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
            response_metadata=dict(info),
        )
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])
