/* router_image.h - image content parts of a chat request
 * (router_image.c): checked at the router, routed only to a worker that
 * takes images, counted in the books. Private to src/router.
 */
#ifndef SPILLWAY_ROUTER_IMAGE_H
#define SPILLWAY_ROUTER_IMAGE_H

#include "router/router.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Checks every {"type": "image_url"} part of body's messages: 0 and
 * their count in *n_images, or -1 with the 400's code
 * (invalid_image, image_too_large, image_url_not_supported), its
 * message and the part that is wrong (param). */
int rt__images_check(const rt_config *cfg, json_t *body, int *n_images, const char **code,
                     char *msg, size_t cap, char *param, size_t param_cap);

/* Whether body's messages hold an image part. */
bool rt__images_in(json_t *body);

/* A copy of body (json_decref) without its image parts (a content left
 * empty becomes ""), for counting the text's tokens; NULL out of
 * memory. */
json_t *rt__images_stripped(json_t *body);

#endif
