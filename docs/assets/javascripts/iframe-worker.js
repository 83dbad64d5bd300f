/* A Worker for pages opened from the file system (file://), where browsers refuse to start one.
 * Material for MkDocs runs its search in a worker; its offline plugin would load a shim for this
 * from a CDN, and this site fetches nothing from the network, so it carries its own (written for
 * this site; the offline plugin takes any polyfill named "iframe-worker" as the shim).
 * The worker's script runs in a hidden same-origin iframe: the page's postMessage becomes a
 * "message" event there, and the script's postMessage a "message" event on the Worker object.
 * Over http(s) nothing is replaced. */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class FrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._pending = [];
      this._ready = false;
      this._frame = document.createElement("iframe");
      this._frame.hidden = true;
      this._frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this._frame);
      const scope = this._frame.contentWindow;
      scope.postMessage = (data) => this._emit("message", new MessageEvent("message", { data: data }));
      scope.importScripts = () => {
        throw new Error("importScripts is not available to a worker started from file://");
      };
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this._ready = true;
        for (const data of this._pending.splice(0)) this._send(data);
      };
      script.onerror = () => this._emit("error", new ErrorEvent("error", { message: "cannot load " + script.src }));
      scope.document.head.appendChild(script);
    }

    _emit(type, event) {
      this.dispatchEvent(event);
      const handler = type === "message" ? this.onmessage : this.onerror;
      if (typeof handler === "function") handler.call(this, event);
    }

    _send(data) {
      const scope = this._frame.contentWindow;
      scope.dispatchEvent(new scope.MessageEvent("message", { data: data }));
    }

    postMessage(data) {
      if (this._ready) this._send(data);
      else this._pending.push(data);
    }

    terminate() {
      this._frame.remove();
    }
  }

  window.Worker = FrameWorker;
})();
