#include "server/webui.h"

namespace ds4::server {

std::string_view webui_content_type(std::string_view name) {
    struct Kind {
        std::string_view ext, type;
    };
    // The kinds a page of plain files needs; text kinds name their charset so that a browser
    // never guesses it (the files are UTF-8).
    static constexpr Kind kinds[] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
        {".json", "application/json"},
        {".ico", "image/x-icon"},
        {".txt", "text/plain; charset=utf-8"},
    };
    for (const Kind &k : kinds)
        if (name.size() > k.ext.size() && name.ends_with(k.ext)) return k.type;
    return "application/octet-stream";
}

std::optional<WebAsset> webui_asset(std::string_view path) {
    if (!path.starts_with('/')) return std::nullopt;
    std::string_view name = path.substr(1);
    if (name.empty()) name = "index.html";
    for (const WebFile &f : webui_files())
        if (f.name == name) return WebAsset{f.name, f.body, webui_content_type(f.name)};
    return std::nullopt;
}

}  // namespace ds4::server
