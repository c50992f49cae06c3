/* chat_content.h - the text of an OpenAI chat message's `content`.
 *
 * OpenAI lets `content` be a string or an array of parts:
 * [{"type": "text", "text": "..."}, {"type": "image_url", ...}, ...].
 * Clients (SDKs, chat front-ends) send the array form for plain text too,
 * so the worker, which renders the prompt, and the router, which counts
 * its tokens, must read it the same way: the text parts joined with "\n"
 * (as llama.cpp's server joins them). spillway's models take text only, so
 * any other part type is refused rather than dropped: a client whose
 * image silently vanished would get an answer about nothing.
 */
#ifndef SPILLWAY_CHAT_CHAT_CONTENT_H
#define SPILLWAY_CHAT_CHAT_CONTENT_H

#include <jansson.h>
#include <stddef.h>

/* The text of content (a string or an array of parts) in *out (sw_free).
 * SW_OK; SW_EINVAL (neither a string nor an array of part objects, a text
 * part without a string "text") or SW_EUNSUPPORTED (a part that is not
 * text), with a sentence for the client in why; SW_ENOMEM. */
int sw_chat_content_text(const json_t *content, char **out, char *why, size_t why_cap);

#endif
