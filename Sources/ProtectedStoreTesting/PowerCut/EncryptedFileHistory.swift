import Foundation
import ProtectedStore
import ProtectedStoreCore

/// The plaintext versions one encrypted file went through while a recording ran, and the check every power-cut
/// state of it must pass: what an fsync had made durable reads back exactly, and every other byte is the old or the
/// new value of a write the program made (or zero where the file grew). A block that fails authentication is a
/// violation unless a write since the last fsync covered it: a torn write can always destroy the block it writes,
/// never another one.
package final class EncryptedFileHistory {
    struct Version {
        let content: [UInt8]
        let isSynchronized: Bool
        /// Plaintext bytes the change that made this version wrote (empty for a truncate or an fsync).
        let written: Range<Int64>?
    }

    /// The file's name under the recorded root.
    package let name: String
    private var versions: [Version]
    private let recording: PowerCutRecording

    /// Starts the history with the file's content as of the recording's start (synchronized before it began).
    package init(name: String, initialContent: [UInt8], recording: PowerCutRecording) {
        self.name = name
        self.recording = recording
        versions = [Version(content: initialContent, isSynchronized: true, written: nil)]
        recording.mark(0)
    }

    package var current: [UInt8] { versions[versions.count - 1].content }

    /// Applies a plaintext write to the model; call `completed()` once the real write has returned.
    package func write(_ bytes: [UInt8], at offset: Int64) {
        var content = current
        let end = Int(offset) + bytes.count
        if content.count < end { content += [UInt8](repeating: 0, count: end - content.count) }
        content.replaceSubrange(Int(offset)..<end, with: bytes)
        versions.append(Version(content: content, isSynchronized: false, written: offset..<Int64(end)))
    }

    /// Applies a truncate to the model; call `completed()` once the real truncate has returned.
    package func truncate(to size: Int64) {
        var content = current
        if content.count > Int(size) { content.removeLast(content.count - Int(size)) } else { content += [UInt8](repeating: 0, count: Int(size) - content.count) }
        versions.append(Version(content: content, isSynchronized: false, written: nil))
    }

    /// Records that an fsync of the file returned: the current version is durable.
    package func synchronized() {
        versions.append(Version(content: current, isSynchronized: true, written: nil))
        completed()
    }

    /// Marks the latest model change as returned by the real call.
    package func completed() { recording.mark(versions.count - 1) }

    /// The problems the state shows for this file, opened as an encrypted file with `keys` (empty when it is a state
    /// the rules allow).
    package func check(_ state: PowerCutState, keys: any ClassKeyProviding) -> [String] {
        check(state) { try EncryptedFile.open(at: $0, keys: keys, writable: false) }
    }

    /// The problems the state shows for this file, opened by `open` (given its path in the state).
    package func check(_ state: PowerCutState, open: (String) throws -> any PlaintextReading) -> [String] {
        let returned = state.marks.last ?? 0
        let durable = (0...returned).last { versions[$0].isSynchronized } ?? 0
        // The call in flight at the cut may have reached the disk in part: its version counts as possible too.
        let possible = Array(versions[durable...min(returned + 1, versions.count - 1)])
        let path = (state.path as NSString).appendingPathComponent(name)
        let file: any PlaintextReading
        do {
            file = try open(path)
        } catch {
            return ["\(name) does not open: \(error)"]
        }
        defer { try? file.close() }
        let size = file.size
        guard possible.contains(where: { Int64($0.content.count) == size }) else {
            return ["\(name) is \(size) bytes; the program's versions since its last fsync were \(Set(possible.map(\.content.count)).sorted())"]
        }
        let blockSize = Int64(file.blockSize)
        let covered = possible.dropFirst().compactMap(\.written)
        let shortest = possible.map(\.content.count).min() ?? 0
        var block: Int64 = 0
        while block * blockSize < size {
            let start = block * blockSize
            let bytes: [UInt8]
            do {
                bytes = try file.read(at: start, count: Int(blockSize))
            } catch {
                if !covered.contains(where: { $0.overlaps(start..<start + blockSize) }) {
                    return ["\(name): block \(block), which no write since the last fsync touched, is unreadable: \(error)"]
                }
                block += 1
                continue
            }
            for (index, byte) in bytes.enumerated() {
                let offset = Int(start) + index
                let allowed = possible.contains { offset < $0.content.count && $0.content[offset] == byte } || (byte == 0 && offset >= shortest)
                if !allowed {
                    return ["\(name): byte \(offset) is \(byte), a value no version of the file held there"]
                }
            }
            block += 1
        }
        return []
    }
}

/// What the history's check needs of an opened file: its size, its block size, and reads.
package protocol PlaintextReading {
    var size: Int64 { get }
    var blockSize: Int { get }
    func read(at offset: Int64, count: Int) throws -> [UInt8]
    func close() throws
}

extension EncryptedFile: PlaintextReading {}
