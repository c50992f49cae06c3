/* chat_template-impl.h - what chat_template.c shares with the renderers
 * kept in files of their own (chat_harmony.c): the builder that measures
 * and then writes a prompt, recording which byte ranges are the template's
 * own text and which are client content (chat_template.c explains it). */
#ifndef SPILLWAY_CHAT_CHAT_TEMPLATE_IMPL_H
#define SPILLWAY_CHAT_CHAT_TEMPLATE_IMPL_H

#include "chat/chat_template.h"

typedef struct chat_builder {
    char *text;             /* NULL while measuring */
    eng_chat_segment *segs; /* NULL while measuring */
    size_t len;             /* bytes so far */
    size_t n_segs;
    bool last_is_template;  /* kind of segment n_segs - 1 */
    bool too_long;
    bool failed;            /* a renderer ran out of memory */
} chat_builder;

/* len bytes of s, as template text or client content. */
void eng_chat__append(chat_builder *b, const char *s, size_t len, bool is_template);

/* gpt-oss's harmony format (chat_harmony.c); messages validated. */
void eng_chat__render_harmony(chat_builder *b, const eng_chat_message *m,
                              const eng_chat_message_tools *ext, size_t n,
                              const eng_chat_options *o);

#endif
