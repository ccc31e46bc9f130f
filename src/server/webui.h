#pragma once
// The chat page of ds4-server (docs/SERVER.md, Chat page): the files of src/server/webui/,
// embedded into the binary at build time (webui/embed.cmake writes webui_files.cpp), and the
// lookup from a request path to one of them with its Content-Type. Routing, headers and the API
// key rule are the HTTP layer's (http_server.cpp).
#include <optional>
#include <span>
#include <string_view>

namespace ds4::server {

// One embedded file: its name in src/server/webui/ ("app.js") and its bytes.
struct WebFile {
    std::string_view name;
    std::string_view body;
};

// Every embedded file, in the order src/server/CMakeLists.txt lists them (generated).
std::span<const WebFile> webui_files();

// The Content-Type of a file by its extension: the page's own kinds (html, js, css, svg, png,
// json, ico, txt), charset=utf-8 for text; application/octet-stream for anything else.
std::string_view webui_content_type(std::string_view name);

struct WebAsset {
    std::string_view name;  // the file served ("index.html" for "/")
    std::string_view body;
    std::string_view content_type;
};

// The file a GET path names: "/" is index.html, "/NAME" an embedded file; nullopt otherwise
// (subfolders, query strings and unknown names are not files of the page).
std::optional<WebAsset> webui_asset(std::string_view path);

}  // namespace ds4::server
