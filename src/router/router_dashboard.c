/* router_dashboard.c - GET /dashboard: one HTML page (CSS and JavaScript
 * inline, no request to another host, no framework) that draws the router
 * from its data routes: /v1/spillway/stats every 2 s, the failover
 * timeline from /v1/spillway/events/stream, the drill report from
 * /v1/spillway/drill. The page is src/router/dashboard.html, turned into
 * rt__dashboard_html at build time (cmake/embed.cmake).
 *
 * It holds no data, so it is served without a key; with [server]
 * api-keys set, the page asks for one and sends it as a Bearer token to
 * the data routes, which require it.
 */
#include "router/router-impl.h"

#include <stddef.h>

extern const unsigned char rt__dashboard_html[];
extern const size_t rt__dashboard_html_len;

void rt__handle_dashboard(rt_req *q)
{
    /* inline script and style are the page's own; nothing else may load */
    rt__send_response(q, 200, "text/html; charset=utf-8",
                      "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                      "X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"
                      "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                      "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' blob: data:; "
                      "frame-ancestors 'none'; base-uri 'none'; form-action 'none'\r\n",
                      (const char *)rt__dashboard_html, rt__dashboard_html_len);
}
