/**
 * The model layer: the Model contract, the providers, the scripted model and the prompt.
 */
export { ModelError, isModelError, type Model, type ModelErrorKind, type ModelRejection, type ModelReply, type ModelRequest } from "./contract.js";
export { createModel, DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT_MS, type CreateModelOptions } from "./providers.js";
export { AnthropicModel, type AnthropicModelOptions, type FetchLike } from "./anthropic.js";
export { OpenAIModel, type OpenAIModelOptions } from "./openai.js";
export { ScriptedModel, ScriptedRound, ScriptedScript } from "./scripted.js";
export { SYSTEM_PROMPT, STEP_TOOL, renderUserMessage } from "./prompt.js";
